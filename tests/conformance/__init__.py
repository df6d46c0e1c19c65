"""On the wire as other implementations read it (issue 32): acknowledgements, SOAP's processing
model, refusals before acknowledgement, who may speak for a sequence, bounds, and replays of
messages written by CXF, Sandesha2, WCF and the specifications against a reliable spyne service."""

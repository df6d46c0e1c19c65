"""The server side: a spyne service behind an interceptor chain, made reliable.

* :mod:`.service` -- :func:`reliable_service`, the one call that makes an
  existing spyne ``Application`` reliable (and its :class:`ReliableService`);
* :mod:`.adapter` -- :func:`engage`, the WSGI middleware that runs the chain in
  front of spyne (any chain, not only WS-RM);
* :mod:`.direct` -- spyne's own request handling (``handle_rpc``) called
  without its WSGI call (the adapter's way to hand spyne a request);
* :mod:`.reliable` -- the server's WS-RM interceptor and the invoker's
  deliverer that re-drives spyne from the store.

Importing this package imports spyne, never zeep.
"""

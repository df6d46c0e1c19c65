"""WS-ReliableMessaging engine, independent of any SOAP framework."""

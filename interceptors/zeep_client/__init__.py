"""The client side: a zeep client behind an interceptor chain, made reliable.

* :mod:`.client` -- :func:`reliable_client`, the one call that makes an
  existing zeep ``Client`` reliable (and its :class:`ReliableClient`);
* :mod:`.adapter` -- :func:`engage_client`, the zeep plugin and transport
  wrapper that run the chain on every request and reply (any chain);
* :mod:`.reliable` -- the client's WS-RM interceptor (a call goes into the
  source store) and the reply dispatch that survives restarts.

Importing this package imports zeep, never spyne.
"""

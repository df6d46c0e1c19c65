"""A small XA transaction manager with a durable recovery log (see README)."""

from .xa import XAException, XAResource
from .xid import FORMAT_ID, Xid

__all__ = ["FORMAT_ID", "XAException", "XAResource", "Xid"]

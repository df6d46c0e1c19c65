"""``wsrm resend``: send a faulted sequence's messages again, on a new sequence.

::

    wsrm status --store sqlite:///var/lib/orders/rm.db        # lists faulted sequences and why
    wsrm resend --store sqlite:///var/lib/orders/rm.db --sequence urn:uuid:...
    wsrm resend --store sqlite:///var/lib/orders/rm.db --all

A source sequence is faulted when the peer refused it (no WS-RM there,
CreateSequenceRefused) or did not acknowledge within ``max_retries``.  Its
unacknowledged messages stay in the store; once the cause is fixed, this
moves them to a new sequence to the same service, in order, with their
reply callbacks, and deletes the faulted one.  The engine that owns the
store (running, or at its next start) sends them.  A message the service
received but never acknowledged is sent again too: resend once the cause is
known, not blindly.  ``--sequence`` takes the id ``wsrm status`` shows, or
the store key in ``(creating: KEY)`` for a sequence the peer never opened.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO

from .engine.resend import faulted_sequences, resend_faulted
from .store import open_store

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="the store URL: sqlite:///path.db, postgresql://...")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sequence", metavar="ID", help="the faulted sequence (its id or store key)")
    which.add_argument("--all", action="store_true", help="every faulted sequence in the store")


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    try:
        store = open_store(args.store, create=False)
    except Exception as exc:  # noqa: BLE001 -- any reason the store cannot be opened, said in one line
        sys.stderr.write(f"wsrm resend: cannot open {args.store!r}: {type(exc).__name__}: {exc}\n")
        return 2
    try:
        keys = [k for k, _, _ in faulted_sequences(store)] if args.all else [args.sequence]
        if not keys:
            out.write("no faulted sequences\n")
            return 0
        for key in keys:
            try:
                result = resend_faulted(store, key)
            except (LookupError, ValueError) as exc:
                sys.stderr.write(f"wsrm resend: {exc.args[0] if exc.args else exc}\n")
                return 1
            out.write(f"{result.faulted_id or result.faulted_key} ({result.reason}): "
                      f"{len(result.receipts)} message(s) moved to new sequence {result.new_key}\n")
        return 0
    finally:
        store.close()

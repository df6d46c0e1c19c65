"""The poison store, for operators: list, show, retry and discard messages the application kept failing on.

::

    wsrm poison list    --store sqlite:///var/lib/orders/rm.db
    wsrm poison show    --store postgresql://rm@db/orders 'urn:uuid:6a1f...#17'
    wsrm poison retry   --store sqlite:///rm.db 'urn:uuid:6a1f...#17'
    wsrm poison discard --store sqlite:///rm.db 'urn:uuid:6a1f...#17' --yes

A message lands in the poison store when every retry cycle of its delivery
failed (see ``RMPolicy.max_retry_cycles``); the engine never deletes it from
there.  An ID is ``<sequence id>#<message number>`` as ``list`` prints it.

``retry`` puts the message back into its sequence's buffer with a fresh
retry budget: a running engine delivers it at its next poll (a held sequence
resumes with it, in order).  ``discard`` deletes it for good, which needs
``--yes``: it is the one way an accepted message ends without being
processed.  Both work on a store a running engine uses (the store's locks
order them with its deliveries).  The same operations are a Python API:
:func:`list_poison`, :func:`get_poison`, :func:`retry_poison`,
:func:`discard_poison` (and ``ReliableEngine.poison_messages()`` and friends).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
from typing import IO

from .store import PoisonMessage, StorageManager, UnknownMessageError, open_store

__all__ = ["parse_poison_id", "list_poison", "get_poison", "retry_poison", "discard_poison",
           "add_arguments", "run"]

log = logging.getLogger(__name__)


def parse_poison_id(poison_id: str) -> tuple[str, int]:
    """``"<sequence id>#<number>"`` -> (sequence id, number); ValueError when it is not one."""
    sequence_id, sep, number = str(poison_id).rpartition("#")
    if not sep or not sequence_id or not number.isdigit() or int(number) < 1:
        raise ValueError(f"{poison_id!r} is not a poison message id: expected '<sequence id>#<message "
                         "number>' as `wsrm poison list` prints it")
    return sequence_id, int(number)


def list_poison(store: StorageManager, sequence_id: str | None = None) -> list[PoisonMessage]:
    """Every poison message (of one sequence), oldest first."""
    with store.begin() as tx:
        return tx.invoker.list_poison(sequence_id)


def get_poison(store: StorageManager, poison_id: str) -> PoisonMessage:
    """One poison message; :class:`UnknownMessageError` when there is none by that id."""
    sequence_id, number = parse_poison_id(poison_id)
    with store.begin() as tx:
        found = tx.invoker.get_poison(sequence_id, number)
    if found is None:
        raise UnknownMessageError(f"no poison message {poison_id!r} in {store.url}")
    return found


def retry_poison(store: StorageManager, poison_id: str) -> PoisonMessage:
    """Put a poison message back for delivery (in order, in its sequence), its attempts reset."""
    sequence_id, number = parse_poison_id(poison_id)
    with store.begin() as tx:
        poisoned = tx.invoker.get_poison(sequence_id, number)
        if poisoned is None:
            raise UnknownMessageError(f"no poison message {poison_id!r} in {store.url}")
        tx.invoker.retry_poison(sequence_id, number)
    log.warning("poison message %s put back for delivery", poison_id)
    return poisoned


def discard_poison(store: StorageManager, poison_id: str) -> PoisonMessage:
    """Delete a poison message for good (an operator's decision); its sequence goes on."""
    sequence_id, number = parse_poison_id(poison_id)
    with store.begin() as tx:
        poisoned = tx.invoker.discard_poison(sequence_id, number)
    log.warning("poison message %s discarded by an operator (%d bytes, action %s)", poison_id,
                len(poisoned.payload), poisoned.action)
    return poisoned


# -- the command ---------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="poison_command", required=True, metavar="ACTION")
    for name, text in (("list", "list the poison messages"),
                       ("show", "one poison message with its envelope"),
                       ("retry", "put a poison message back for delivery"),
                       ("discard", "delete a poison message for good (needs --yes)")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--store", required=True, help="store URL (sqlite:///..., postgresql://...)")
        if name == "list":
            p.add_argument("--sequence", help="only this sequence's messages")
            p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
        else:
            p.add_argument("id", help="<sequence id>#<message number>, as `wsrm poison list` prints it")
        if name == "show":
            p.add_argument("--json", action="store_true", help="JSON with the envelope as text")
        if name == "discard":
            p.add_argument("--yes", action="store_true",
                           help="confirm: the message is deleted and will never be processed")


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds") if ts else "-"


def _as_dict(p: PoisonMessage, envelope: bool = False) -> dict[str, object]:
    out: dict[str, object] = {
        "id": p.poison_id, "sequence_id": p.sequence_id, "number": p.number, "message_id": p.message_id,
        "action": p.action, "soap_version": p.soap_version, "reply_to": p.reply_to,
        "received_at": p.received_at, "poisoned_at": p.poisoned_at, "attempts": p.total_attempts,
        "cycles": p.cycles, "sequence_held": p.held, "last_error": p.last_error, "bytes": len(p.payload),
    }
    if envelope:
        out["envelope"] = p.payload.decode("utf-8", errors="replace")
    return out


def run(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    err = sys.stderr
    command = args.poison_command
    if command == "discard" and not args.yes:
        print(f"wsrm poison discard: refusing to delete {args.id!r} without --yes (the message would "
              "never be processed; `wsrm poison retry` puts it back for delivery instead)", file=err)
        return 2
    try:
        store = open_store(args.store, create=False)
    except Exception as exc:  # noqa: BLE001 -- a bad URL or an unreachable store: say which
        print(f"wsrm poison: cannot open store {args.store!r}: {exc}", file=err)
        return 2
    try:
        if command == "list":
            found = list_poison(store, args.sequence)
            if args.json:
                for p in found:
                    print(json.dumps(_as_dict(p)), file=out)
                return 0
            if not found:
                print(f"no poison messages in {store.url}", file=out)
                return 0
            print(f"{'ID':<52} {'ATTEMPTS':>8} {'CYCLES':>6} {'HELD':<4} {'POISONED AT':<19} LAST ERROR", file=out)
            for p in found:
                error = (p.last_error or "").splitlines()[0][:60] if p.last_error else ""
                print(f"{p.poison_id:<52} {p.total_attempts:>8} {p.cycles:>6} {'yes' if p.held else 'no':<4} "
                      f"{_when(p.poisoned_at):<19} {error}", file=out)
            print(f"{len(found)} poison message(s)", file=out)
            return 0
        if command == "show":
            p = get_poison(store, args.id)
            if args.json:
                print(json.dumps(_as_dict(p, envelope=True), indent=2), file=out)
                return 0
            for key, value in _as_dict(p).items():
                print(f"{key + ':':<15} {value}", file=out)
            print("envelope:", file=out)
            print(p.payload.decode("utf-8", errors="replace"), file=out)
            return 0
        if command == "retry":
            p = retry_poison(store, args.id)
            print(f"{p.poison_id}: put back for delivery (attempts reset)", file=out)
            return 0
        p = discard_poison(store, args.id)
        print(f"{p.poison_id}: discarded", file=out)
        return 0
    except (ValueError, UnknownMessageError) as exc:
        print(f"wsrm poison {command}: {exc}", file=err)
        return 1
    finally:
        store.close()

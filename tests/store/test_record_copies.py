"""A record copied with one field changed keeps every other field (the shortcut beside
``dataclasses.replace`` names the fields one by one: a field added later must be named there)."""

from __future__ import annotations

import dataclasses

from wsrm_plugin.statemachine.ackranges import AckRanges
from wsrm_plugin.store.api import RmdSequence


def _unlike_defaults() -> RmdSequence:
    """A row whose every field differs from its default, each from the others of its type."""
    values = {}
    for number, f in enumerate(dataclasses.fields(RmdSequence), start=1):
        kind = str(f.type)
        if "AckRanges" in kind:
            values[f.name] = AckRanges.from_ranges([(1, number)])
        elif kind == "bool":
            values[f.name] = True
        elif "float" in kind:
            values[f.name] = number + 0.5
        elif "int" in kind:
            values[f.name] = number
        else:
            values[f.name] = f"value {number}"
    return RmdSequence(**values)


def test_with_received_keeps_every_other_field() -> None:
    seq = _unlike_defaults()
    received = AckRanges.from_ranges([(1, 99)])
    copied = seq.with_received(received)
    assert copied == dataclasses.replace(seq, received=received)
    assert copied.received is received
    for f in dataclasses.fields(RmdSequence):
        if f.name != "received":
            assert getattr(copied, f.name) == getattr(seq, f.name) != f.default, f.name

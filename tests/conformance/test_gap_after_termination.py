"""Nothing accepted is deleted (issue 32, item 9).

A source that terminates a sequence with a gap (message 2 never sent, or resent
only after CloseSequence, which WS-RM 1.1 refuses with SequenceClosed) leaves
messages 3 and 4 accepted and acknowledged but never deliverable in order.  They
go to the poison store with the reason, visible in ``wsrm status`` and ``wsrm
poison list``, where an operator delivers them out of order or discards them.
"""

from __future__ import annotations

import io

from tests.engine.support import wait_for
from wsrm_plugin.cli import main as wsrm
from wsrm_plugin.wire import SequenceClosed

from . import service
from .peer import RawPeer, fault_of, note, ranges_of


def _cli(*args: str) -> str:
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = wsrm(list(args))
    assert code == 0, out.getvalue()
    return out.getvalue()


def test_messages_behind_a_gap_of_a_terminated_sequence_go_to_the_poison_store(servers, tmp_path):
    store = f"sqlite:///{tmp_path / 'service.db'}"
    server = servers(store=store)
    peer = RawPeer(server.url)
    identifier, _ = peer.open()
    for n in (1, 3, 4):
        peer.message(identifier, n, note(f"n{n}"))
    assert wait_for(lambda: service.ran("n1") == 1)
    assert ranges_of(peer.close(identifier, 4), identifier) == [(1, 1), (3, 4)]
    # message 2 resent after CloseSequence: refused, as WS-RM 1.1 requires
    late = peer.message(identifier, 2, note("n2"))
    assert isinstance(fault_of(late), SequenceClosed)
    peer.terminate(identifier, 4)

    engine = server.engine
    assert wait_for(lambda: len(engine.poison_messages(identifier)) == 2, timeout=30), engine.store.status()
    assert wait_for(lambda: engine.store.status().rmd == ())  # the sequence itself is released
    kept = engine.poison_messages(identifier)
    assert [p.number for p in kept] == [3, 4]
    assert all("behind a gap that will never be filled" in p.last_error and "without message(s) 2" in p.last_error
               for p in kept), [p.last_error for p in kept]
    assert service.ran("n3") == service.ran("n4") == 0

    listing = _cli("poison", "list", "--store", store)
    assert f"{identifier}#3" in listing and "behind a gap" in listing
    assert "poison messages           2" in _cli("status", "--store", store)

    # the operator delivers 3 out of order and discards 4
    engine.retry_poison(f"{identifier}#3")
    assert wait_for(lambda: service.ran("n3") == 1, timeout=30)
    engine.discard_poison(f"{identifier}#4")
    assert engine.poison_messages(identifier) == []
    assert service.ran("n4") == 0

"""Under XA in one database, one busy sequence: a receipt at the COMMIT guesses only from a row that holds.

A PostgreSQL service under a transaction manager, its application writing through an
``XADataSource`` on the store's own database (one branch, one phase), runs a one-way message's
application before its receipt and sends the receipt with the COMMIT, guessed from its last
delivery of the sequence (``Destination._one_way_at_commit``).  A guess the COMMIT finds wrong
rolls the application's work back and runs it again the general way; three not forgiven and the
sequence goes the general way.  With one busy sequence, guesses failed although nothing but this
process received on it (``bench/bench_server_path.py --store xa1 --on-receipt``: 2-7 of 1,000
declined, each time with the next number under way, or after a message that filled a gap), and
once one message went the general way the next ones did too.  Each case is staged here with
the engine's own receives over real HTTP, in a fixed order (events, never time): no guess is
declined, each message's application runs once, in order.  Counts, never time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine import destination as destination_module
from wsrm_plugin.engine import invoker as invoker_module

from .conftest import fast_policy
from .support import RM11, item_text, wait_for
from .test_bad_input import open_sequence, send_ok
from .test_delivery_xa_batch import RECEIVED, rows

pytestmark = pytest.mark.postgres

WAIT = 60.0  # seconds at most for an event that the order of the steps makes certain


@dataclass
class Served:
    server: ReliableEngine
    url: str
    dsn: str
    ran: list[str]
    #: per item: called in its application, before its row is written
    before: dict[str, Callable[[], None]]


@pytest.fixture
def served(pg_dsn_factory: Any, tmp_path: Any, monkeypatch: Any) -> Iterator[Callable[..., Served]]:
    monkeypatch.setattr(destination_module, "HELD_BYTES_REFRESH", 3600.0)  # no budget read in a receipt
    monkeypatch.setattr(invoker_module, "QUICK_APPLICATION", 60.0)  # each delivered on receipt, loaded or not
    closers: list[Callable[[], None]] = []

    def make(**policy: Any) -> Served:
        dsn = pg_dsn_factory("xaguess", RECEIVED)
        tm = TransactionManager(node="xa-guess", log=tmp_path / "tm.log")
        ds = XADataSource(dsn, tm)
        closers.extend([tm.close, ds.close])
        ran: list[str] = []
        before: dict[str, Callable[[], None]] = {}

        def application(envelope: bytes, context: object) -> None:
            item = item_text(envelope)
            assert item is not None
            ran.append(item)
            if item in before:
                before[item]()
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO received (item, gtrid) VALUES (%s, %s)",
                            (item, tm.get_transaction().xid.gtrid.hex()))

        server = ReliableEngine("postgresql:" + dsn, fast_policy(deliver_on_receive=True, **policy),
                                application=application, tm=tm, name="server")
        closers.append(lambda: server.stop(timeout=5))
        server.serve()
        server.start()
        return Served(server, server.endpoint_address, dsn, ran, before)

    yield make
    for close in reversed(closers):
        close()


def _delivered(s: Served) -> list[str]:
    return [item for item, _ in rows(s.dsn)]


def test_a_message_that_filled_a_gap_delivers_the_buffer_behind_it_and_the_next_guesses_from_its_row(
        served, monkeypatch):
    """2 arrives after 3 and 4 (buffered behind the gap) and fills the gap: its receipt takes 2,
    and 3 and 4 are in the buffer (no invoker thread delivers them here).  The row its commit
    left says 1-4 received; a guess from it for 5 expects 4 delivered.  So 2's receive delivers
    3 and 4 before it answers, and 5's receipt rides on its COMMIT, guessed from that row; 6 and
    7 follow so.  Before, 2's row was forgotten: 5 went the general way (its receive delivered
    3, 4 and itself), and 6 too (5 was not taken by its receipt): three messages of seven went
    the general way where only the first one (nothing to guess from) and the two the
    overtaking cost (3 buffered, 2 filling the gap) do now.  Counted, never timed."""
    s = served(poll_interval=3600.0)
    dest = s.server.destination
    monkeypatch.setattr(dest, "_wake_invoker", lambda: None)  # 3 and 4 wait for a receive to catch up
    identifier = open_sequence(s.url, RM11)
    assert send_ok(s.url, RM11, identifier, 1, "m1") == [(1, 1)]
    assert send_ok(s.url, RM11, identifier, 3, "m3") == [(1, 1), (3, 3)]
    assert send_ok(s.url, RM11, identifier, 4, "m4") == [(1, 1), (3, 4)]
    assert _delivered(s) == ["m1"]
    assert send_ok(s.url, RM11, identifier, 2, "m2") == [(1, 4)]
    assert _delivered(s) == ["m1", "m2", "m3", "m4"]  # (before: m1, m2)
    assert dest.receipts_at_commit == 0
    for n in (5, 6, 7):
        assert send_ok(s.url, RM11, identifier, n, f"m{n}") == [(1, n)]
    assert dest.receipts_at_commit == 3  # 5, 6, 7 (before: 7 alone)
    assert dest.receipts_declined_at_commit == 0
    assert _delivered(s) == [f"m{n}" for n in range(1, 8)]
    assert s.ran == [f"m{n}" for n in range(1, 8)]  # no application ran twice


def test_the_gap_fillers_row_holds_when_another_thread_delivered_the_buffer_behind_it(served, monkeypatch):
    """As above, but 3 and 4 are delivered by another thread (here: a catch-up that does not
    report) just before 2's receive looks: it finds nothing left in line up to 4, which, with
    1-4 received, says each was delivered, and 5's receipt still rides on its COMMIT.  One
    that waits for a retry (its application failed) would be in line still: then nothing is
    remembered and 5 goes the general way."""
    s = served(poll_interval=3600.0)
    dest, invoker = s.server.destination, s.server.invoker
    monkeypatch.setattr(dest, "_wake_invoker", lambda: None)
    through = invoker.deliver_through
    answers: list[bool] = []

    def others_first(sequence_id: str, number: int, limit: int = 16, *, settled: bool = False) -> bool:
        if settled:
            through(sequence_id, number)  # (as another receive, or an invoker thread, would)
            answers.append(through(sequence_id, number, settled=True))
            return answers[-1]
        return through(sequence_id, number, limit)

    monkeypatch.setattr(invoker, "deliver_through", others_first)
    identifier = open_sequence(s.url, RM11)
    for n, acked in ((1, [(1, 1)]), (3, [(1, 1), (3, 3)]), (4, [(1, 1), (3, 4)]), (2, [(1, 4)]), (5, [(1, 5)])):
        assert send_ok(s.url, RM11, identifier, n, f"m{n}") == acked
    assert answers == [True]
    assert dest.receipts_at_commit == 1  # 5
    assert dest.receipts_declined_at_commit == 0
    assert _delivered(s) == [f"m{n}" for n in range(1, 6)]
    assert s.ran == [f"m{n}" for n in range(1, 6)]


def test_a_message_whose_next_is_under_way_goes_the_general_way(served, monkeypatch):
    """3 overtook 2: its receive is recording it (behind the gap) when 2 arrives.  2's guess
    from the row 1's commit left (1 received) would expect the row to be so at 2's COMMIT, but
    3's receipt commits first: the COMMIT declined it, and 2's application ran twice.  With a
    higher number of its sequence under way in this process, 2 goes the general way."""
    s = served()
    dest = s.server.destination
    identifier = open_sequence(s.url, RM11)
    assert send_ok(s.url, RM11, identifier, 1, "m1") == [(1, 1)]
    three_recording, two_decided = threading.Event(), threading.Event()
    foreseeable, at_commit = dest._foreseeable, dest._one_way_at_commit

    def hold_three(tx: Any, item: Any) -> Any:  # inside 3's transaction, its receipt written
        if item.header.message_number == 3:
            three_recording.set()
            assert two_decided.wait(WAIT)
        return foreseeable(tx, item)

    def two_at_commit(item: Any, invoker: Any) -> Any:
        if item.header.message_number != 2:
            return at_commit(item, invoker)
        outcome = at_commit(item, invoker)
        two_decided.set()  # (the general way: before its receipt waits for 3's commit)
        return outcome

    monkeypatch.setattr(dest, "_foreseeable", hold_three)
    monkeypatch.setattr(dest, "_one_way_at_commit", two_at_commit)
    s.before["m2"] = two_decided.set  # guessed: its application runs before its receipt
    third = threading.Thread(target=send_ok, args=(s.url, RM11, identifier, 3, "m3"))
    third.start()
    try:
        assert three_recording.wait(WAIT)
        assert send_ok(s.url, RM11, identifier, 2, "m2") == [(1, 3)]
    finally:
        two_decided.set()
        third.join(WAIT)
    assert wait_for(lambda: _delivered(s) == ["m1", "m2", "m3"], timeout=WAIT), _delivered(s)
    assert dest.receipts_declined_at_commit == 0
    assert s.ran == ["m1", "m2", "m3"]


def test_the_message_after_one_received_the_general_way_guesses_from_its_commit(served, monkeypatch):
    """1 goes the general way (nothing foreseen yet) and its receipt takes it before its
    application runs; 2 arrives meanwhile.  2's turn came when 1 was taken, before 1's commit
    had left the row to guess from: 2 went the general way too, and so did every message that
    arrived while the one before it committed (one busy sequence: most of them).  Now 2's turn
    comes once 1's commit is remembered, and 2's receipt rides on its COMMIT."""
    s = served()
    dest = s.server.destination
    identifier = open_sequence(s.url, RM11)
    two_arrived, two_decided = threading.Event(), threading.Event()
    at_commit = dest._one_way_at_commit

    def two_at_commit(item: Any, invoker: Any) -> Any:
        if item.header.message_number == 2:
            two_decided.set()  # (guessed or not: it decided after 1's turn)
        return at_commit(item, invoker)

    monkeypatch.setattr(dest, "_one_way_at_commit", two_at_commit)

    def one_waits() -> None:  # 1's application, run after its receipt took it
        assert two_arrived.wait(WAIT)
        two_decided.wait(1.0)  # (not before 1's commit when 2's turn waits for it: then 1 s)

    s.before["m1"] = one_waits
    first = threading.Thread(target=send_ok, args=(s.url, RM11, identifier, 1, "m1"))
    first.start()
    try:
        assert wait_for(lambda: s.ran == ["m1"], timeout=WAIT), s.ran
        second = threading.Thread(target=send_ok, args=(s.url, RM11, identifier, 2, "m2"))
        second.start()
        assert wait_for(lambda: dest._under_way[(identifier, 2)] > 0 or bool(_delivered(s)), timeout=WAIT)
        two_arrived.set()
        second.join(WAIT)
    finally:
        two_arrived.set()
        first.join(WAIT)
    assert _delivered(s) == ["m1", "m2"]
    assert dest.receipts_at_commit == 1
    assert dest.receipts_declined_at_commit == 0
    assert s.ran == ["m1", "m2"]


def test_the_bound_of_the_bytes_held_is_asked_again_after_a_response_not_in_a_receipt(served, monkeypatch):
    """The bound of the bytes held undelivered is asked of the store at most every
    ``HELD_BYTES_REFRESH`` seconds; a receive that found it older asked inside its own
    transaction, which a receipt riding on its COMMIT cannot: it went the general way (once a
    second, about 1.5% of the messages at 16 sequences).  Here each message finds the bound
    aged past ``HELD_BYTES_EARLY`` of that (the clock is the bound's, moved back): its receipt
    rides on its COMMIT, and the store is asked once its response is written, so the next one
    finds the bound fresh again.  Before, every other message went the general way."""
    s = served()
    dest = s.server.destination
    refreshed: list[float] = []
    refresh = dest._refresh_held

    def counted() -> None:
        refresh()
        refreshed.append(dest._held_asked_at)

    monkeypatch.setattr(dest, "_refresh_held", counted)
    identifier = open_sequence(s.url, RM11)
    assert send_ok(s.url, RM11, identifier, 1, "m1") == [(1, 1)]  # the general way: the store asked
    aged = destination_module.HELD_BYTES_REFRESH * (destination_module.HELD_BYTES_EARLY + 1) / 2
    for n in range(2, 12):
        assert wait_for(lambda: dest._held_refresh_at == float("-inf"), timeout=WAIT)  # the last one's, done
        dest._held_asked_at -= aged  # as if that long had passed since the store was asked
        assert send_ok(s.url, RM11, identifier, n, f"m{n}") == [(1, n)]
    assert dest.receipts_at_commit == 10  # 2..11
    assert dest.receipts_declined_at_commit == 0
    assert wait_for(lambda: len(refreshed) == 10, timeout=WAIT), refreshed
    # one handed to a response that never ran it (a body nobody closed) is given up in time
    assert wait_for(lambda: dest._held_refresh_at == float("-inf"), timeout=WAIT)
    dest._held_refresh_at = time.monotonic() - destination_module.HELD_BYTES_REFRESH
    dest._held_asked_at -= aged
    assert send_ok(s.url, RM11, identifier, 12, "m12") == [(1, 12)]
    assert dest.receipts_at_commit == 11
    assert wait_for(lambda: len(refreshed) == 11, timeout=WAIT), refreshed
    assert _delivered(s) == [f"m{n}" for n in range(1, 13)]

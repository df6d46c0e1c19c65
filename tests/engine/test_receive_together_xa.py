"""Under XA on PostgreSQL, receives of several sequences that deliver on receipt at once share one global transaction.

Each message delivered on receipt under a transaction manager is a global
transaction: a PREPARE and a COMMIT PREPARED of the store's branch and of the
application's (each flushed by PostgreSQL) and the commit mark.  Receives that
wait for one another at the same time are now recorded and delivered in one
global transaction by the first of them (``RMPolicy.receive_together``).  The
transaction manager has no savepoint across branches, so a part that fails
rolls the whole global transaction back: the failed message is buffered (as
alone), every other receive goes again alone, and nothing commits twice.

Everything is real: the server's store and the application's table are two
PostgreSQL databases, the application writes through an ``XADataSource`` each
row with the gtrid of its global transaction (the committed rows show which
messages shared one), real HTTP on 127.0.0.1.  The first receive's application
waits on an event, so the others queue behind it; each test waits for what it asserts.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.policy import AUTOMATIC_HTTP_THREADS_TWO_PHASE, AUTOMATIC_HTTP_THREADS_XA
from wsrm_plugin.wire import UnknownSequence

from .conftest import fast_policy
from .support import RM11, application_message, item_text, post, wait_for
from .test_bad_input import first_message_senders, open_sequence, send_ok
from .test_delivery_xa_batch import RECEIVED, Ledger, rows, xa_application
from tests.zeep_client.test_xa2_one_way import _marking_sessions
from tests.zeep_client.test_xa_call_path import _LOG_STATEMENTS, _sent

pytestmark = pytest.mark.postgres

BEHIND = 3  # the receives that queue behind the first (4 HTTP threads in all)


@dataclass
class Served:
    server: ReliableEngine
    url: str
    app_db: str
    ledger: Ledger
    started: threading.Event
    release: threading.Event


class _Gated(Ledger):
    """The ledger, whose call for "first" waits for ``release`` (after setting ``started``), and
    registers ``hold`` (a synchronization) with its global transaction when there is one."""

    started: threading.Event
    release: threading.Event
    hold: object | None = None

    def __call__(self, envelope: bytes, context: object) -> None:
        super().__call__(envelope, context)
        if item_text(envelope) == "first":
            if self.hold is not None:
                self.tm.get_transaction().register_synchronization(self.hold)
            self.started.set()
            assert self.release.wait(60)


def xa_server(pg_dsn_factory: Callable[..., str], tm: TransactionManager, application: Callable[..., None],
              closers: list[Callable[[], None]], *, store_sql: tuple[str, ...] = (), **policy: Any) -> ReliableEngine:
    """A server on a new PostgreSQL store (``store_sql`` run in its database first), under ``tm``,
    delivering on receipt to ``application`` unless ``policy`` says otherwise: serving and
    started; its stop goes on ``closers``."""
    policy.setdefault("deliver_on_receive", True)
    server = ReliableEngine("postgresql:" + pg_dsn_factory("xastore", *store_sql), fast_policy(**policy),
                            application=application, tm=tm, name="server")
    closers.append(lambda: server.stop(timeout=5))
    server.serve()
    server.start()
    return server


@pytest.fixture
def served(pg_dsn_factory, tmp_path) -> Iterator[Callable[..., Served]]:
    closers: list[Callable[[], None]] = []

    def make(fail: Callable[[str, int], bool] = lambda item, attempt: False, store_sql: tuple[str, ...] = (),
             **policy) -> Served:
        app_db, tm, ds = xa_application(pg_dsn_factory, tmp_path / f"tm{len(closers)}.log", closers,
                                        node="xa-together")
        ledger = _Gated(tm, ds, fail)
        ledger.started, ledger.release = threading.Event(), threading.Event()
        policy.setdefault("receive_together", 16)
        server = xa_server(pg_dsn_factory, tm, ledger, closers, store_sql=store_sql, **policy)
        return Served(server, server.endpoint_address, app_db, ledger, ledger.started, ledger.release)

    yield make
    for close in reversed(closers):
        close()


def _behind_the_first(s: Served, sends: list[threading.Thread]) -> None:
    """Send "first" and, while its application waits, ``sends``: they queue and form one batch."""
    combiner = s.server.destination._together
    assert combiner is not None, "receives that deliver under XA each go alone"
    identifier = open_sequence(s.url, RM11)
    first = threading.Thread(target=send_ok, args=(s.url, RM11, identifier, 1, "first"))
    first.start()
    try:
        assert s.started.wait(30)
        for t in sends:
            t.start()
        assert wait_for(lambda: combiner.queued(None) == len(sends), timeout=30)
    finally:
        s.release.set()
    for t in [first, *sends]:
        t.join(60)


def _committed(s: Served, count: int) -> list[tuple[str, str]]:
    """The application's rows, once ``count`` are visible: a receive is answered at its commit
    decision (``RMPolicy.answer_at_decision``), the application's COMMIT PREPARED follows."""
    assert wait_for(lambda: len(rows(s.app_db)) >= count, timeout=30), rows(s.app_db)
    return rows(s.app_db)


def _sends(s: Served, count: int) -> tuple[list[threading.Thread], list[str], dict[str, list[tuple[int, int]]]]:
    """``count`` messages m0.. each on a sequence of its own: the threads that send them (not
    started), the sequences, and the acknowledgement each gets, by sequence, once it is answered."""
    identifiers = [open_sequence(s.url, RM11) for _ in range(count)]
    senders, answered = first_message_senders(s.url, RM11, identifiers)
    return senders, identifiers, answered


def test_automatic_under_xa_on_postgresql_1_turns_it_off_and_a_size_on(served) -> None:
    automatic = served(receive_together=None).server.destination
    assert automatic._together is not None and automatic._together_if_two_phase
    assert served(receive_together=1).server.destination._together is None
    fixed = served(receive_together=16).server.destination
    assert fixed._together is not None and not fixed._together_if_two_phase


def test_automatic_delivers_together_once_a_delivery_committed_in_two_phases(served) -> None:
    """``receive_together`` left automatic: the application's database is not the store's, so a
    delivery on receipt commits in two phases (a PREPARE and a COMMIT PREPARED of the
    application's branch, the store's with its commit mark); once one did, the receives waiting
    at the same time share one global transaction, as with the knob set."""
    s = served(receive_together=None)
    # the application's data source, registered with the manager, is in another database
    assert s.server.http_threads == AUTOMATIC_HTTP_THREADS_TWO_PHASE
    s.release.set()  # no receive is held in this one
    send_ok(s.url, RM11, open_sequence(s.url, RM11), 1, "alone")
    s.release.clear()
    sends, identifiers, answered = _sends(s, BEHIND)
    _behind_the_first(s, sends)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    gtrids = dict(_committed(s, BEHIND + 2))
    assert sorted(gtrids) == ["alone", "first", *(f"m{n}" for n in range(BEHIND))]
    assert len({gtrids[f"m{n}"] for n in range(BEHIND)}) == 1, gtrids  # one global transaction
    assert len(set(gtrids.values())) == 3


def test_automatic_delivers_each_alone_when_deliveries_commit_in_one_phase(pg_dsn_factory, tmp_path) -> None:
    """The application's table in the store's database: the store's branch and the application's
    are one (a shared session), committed in one phase; a batch would only make its receives wait
    for one another.  Receives that arrive while another's application runs are each delivered
    alone, in a global transaction of its own."""
    db = pg_dsn_factory("xaone", RECEIVED)
    tm = TransactionManager(node="xa-one-phase", log=tmp_path / "tm.log")
    ds = XADataSource(db, tm)
    ledger = _Gated(tm, ds)
    ledger.started, ledger.release = threading.Event(), threading.Event()
    server = ReliableEngine("postgresql:" + db, fast_policy(deliver_on_receive=True), application=ledger,
                            tm=tm, name="server")
    try:
        # the data source is in the store's database: one phase, each receive's commit in its HTTP
        # thread, as many at once as threads to share a WAL flush
        assert server.http_threads == AUTOMATIC_HTTP_THREADS_XA
        server.serve()
        server.start()
        url = server.endpoint_address
        combiner = server.destination._together
        assert combiner is not None
        identifier = open_sequence(url, RM11)
        first = threading.Thread(target=send_ok, args=(url, RM11, identifier, 1, "first"))
        first.start()
        try:
            assert ledger.started.wait(30)
            assert not server.destination._two_phase
            identifiers = [open_sequence(url, RM11) for _ in range(BEHIND)]
            sends, answered = first_message_senders(url, RM11, identifiers)
            for t in sends:
                t.start()
            for t in sends:
                t.join(60)  # each delivered and answered while "first"'s application still runs
            assert answered == {i: [(1, 1)] for i in identifiers}
        finally:
            ledger.release.set()
        first.join(60)
        gtrids = dict(rows(db))
        assert sorted(gtrids) == ["first", *(f"m{n}" for n in range(BEHIND))]
        assert len(set(gtrids.values())) == BEHIND + 1  # each its own global transaction
        assert combiner.batches == 0 and not server.destination._two_phase
    finally:
        server.stop(timeout=5)
        ds.close()
        tm.close()


def test_receives_of_several_sequences_deliver_in_one_global_transaction(served) -> None:
    """Three sequences' messages arrive while the first one's application runs: they are recorded
    and delivered in one global transaction (their rows carry one gtrid, one PREPARE and one
    COMMIT PREPARED of each branch for the three), each acknowledged once it committed."""
    s = served()
    sends, identifiers, answered = _sends(s, BEHIND)
    combiner = s.server.destination._together
    batches, items = combiner.batches, combiner.items
    _behind_the_first(s, sends)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    committed = _committed(s, BEHIND + 1)
    assert sorted(item for item, _ in committed) == ["first", *(f"m{n}" for n in range(BEHIND))]
    gtrids = dict(committed)
    assert len({gtrids[f"m{n}"] for n in range(BEHIND)}) == 1, committed  # one global transaction
    assert gtrids["first"] != gtrids["m0"]
    assert (combiner.batches - batches, combiner.items - items) == (2, BEHIND + 1)
    assert s.server.destination.delivered_on_receipt == BEHIND + 1
    assert all(calls == 1 for calls in s.ledger.calls.values())
    with s.server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_failed_application_in_a_batch_rolls_it_back_and_each_message_commits_once(served) -> None:
    """m2's application fails on its first try, in the batch of three: the global transaction rolls
    back in both databases; m2 is buffered and delivered by the invoker, the two others go again
    alone.  Every message acknowledged, each committed exactly once, nothing of the failed one kept."""
    s = served(fail=lambda item, attempt: item == "m2" and attempt == 1)
    sends, identifiers, answered = _sends(s, BEHIND)
    _behind_the_first(s, sends)
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    expected = sorted(["first", *(f"m{n}" for n in range(BEHIND))])
    assert wait_for(lambda: sorted(item for item, _ in rows(s.app_db)) == expected, timeout=30), rows(s.app_db)
    committed = rows(s.app_db)
    assert Counter(item for item, _ in committed) == Counter(expected)  # each exactly once
    [failed] = s.ledger.failed_gtrids
    assert failed not in {gtrid for _, gtrid in committed}
    assert s.ledger.calls["m2"] == 2
    assert len({gtrid for _, gtrid in committed}) == len(expected)  # after the rollback: each alone
    assert s.server.destination.delivered_on_receipt == BEHIND  # "first" and the two others
    assert wait_for(lambda: s.server.status().delivered == BEHIND + 1, timeout=20), s.server.status()
    with s.server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_refused_receive_in_a_batch_is_refused_alone(served) -> None:
    """A message on an unknown sequence queues with two good ones: it gets its fault, nothing of
    it written, and the two commit in one global transaction."""
    s = served()
    sends, identifiers, answered = _sends(s, BEHIND - 1)
    refused: list[object] = []

    def stray() -> None:
        response = post(s.url, application_message(RM11, s.url, "urn:uuid:not-a-sequence-of-yours", 1, "stray"))
        refused.append((response.status, type(response.fault())))

    sends.insert(1, threading.Thread(target=stray))
    _behind_the_first(s, sends)
    assert refused == [(400, UnknownSequence)]
    assert answered == {identifier: [(1, 1)] for identifier in identifiers}
    committed = dict(_committed(s, BEHIND))
    assert sorted(committed) == ["first", *(f"m{n}" for n in range(BEHIND - 1))]
    assert len({committed[f"m{n}"] for n in range(BEHIND - 1)}) == 1


class _HeldCommit:
    """A synchronization whose ``before_completion`` (the commit's start, every part run) waits."""

    def __init__(self) -> None:
        self.reached, self.release = threading.Event(), threading.Event()

    def before_completion(self) -> None:
        self.reached.set()
        assert self.release.wait(60)

    def after_completion(self, status: object) -> None:
        pass


def test_the_next_batch_runs_while_one_commits(served) -> None:
    """Once a batch's parts all ran, only its commit is left: the receives waiting meanwhile
    start the next batch then (``Combiner.hand_on``), and it delivers and commits while the first
    is still committing.  One batch at a time, m0 waited for "first"'s commit."""
    s = served()
    s.ledger.hold = held = _HeldCommit()
    s.release.set()  # "first"'s application returns at once; its commit is held
    sends, identifiers, answered = _sends(s, 1)
    combiner = s.server.destination._together
    identifier = open_sequence(s.url, RM11)
    first = threading.Thread(target=send_ok, args=(s.url, RM11, identifier, 1, "first"))
    first.start()
    try:
        assert held.reached.wait(30)
        sends[0].start()
        assert wait_for(lambda: identifiers[0] in answered, timeout=30), combiner.queued(None)
        assert [item for item, _ in _committed(s, 1)] == ["m0"]  # committed; "first" is not yet
        assert combiner.handed_on >= 1
    finally:
        held.release.set()
    for t in [first, *sends]:
        t.join(60)
    assert sorted(item for item, _ in _committed(s, 2)) == ["first", "m0"]
    assert answered == {identifiers[0]: [(1, 1)]}


def _second_messages_behind_the_first(s: Served, count: int, wrong: int | None = None) -> list[str]:
    """``count`` sequences, each with message 1 delivered first (the service remembers each row as
    its delivery committed it); then, while "first"'s application waits, each one's message 2
    (``n<i>``): they queue and form one batch.  ``wrong``: that sequence's row changed behind the
    service's back first (a last number, as another process would record), so a receipt guessed
    from what the service remembers is found wrong at the batch's commit."""
    s.release.set()
    identifiers = sorted(open_sequence(s.url, RM11) for _ in range(count))
    for n, identifier in enumerate(identifiers):
        send_ok(s.url, RM11, identifier, 1, f"o{n}")
    # each remembered once its commit returned, which may be after its answer (at the decision)
    foreseen = s.server.destination._foreseen
    assert wait_for(lambda: all(identifier in foreseen for identifier in identifiers), timeout=30)
    s.release.clear()
    if wrong is not None:
        with s.server.store.begin() as tx:
            tx.write("UPDATE rmd_sequence SET last_number = 1000 WHERE sequence_id = ?", (identifiers[wrong],))
    sends = [threading.Thread(target=send_ok, args=(s.url, RM11, identifier, 2, f"n{n}"))
             for n, identifier in enumerate(identifiers)]
    _behind_the_first(s, sends)
    return identifiers


def test_the_receipts_of_a_batch_in_two_phases_ride_on_its_marked_commit(served, pg_server, monkeypatch) -> None:
    """The batch's receives of message 2 (their sequences' rows remembered from message 1's
    commits): each runs its application and sends its receipt with the store's commit, the one
    that carries the decision; the store's branch sends nothing before it, its BEGIN riding
    there too: the branch is one query string (the first receipt took one of its own before,
    with the BEGIN).  Each message committed once, the batch in one global transaction, whose
    phase 2 its leader runs (no worker thread woken for it)."""
    s = served(store_sql=(_LOG_STATEMENTS,))
    dest = s.server.destination
    before = dest.receipts_at_commit
    offset = pg_server.log_path.stat().st_size
    marked = _marking_sessions(monkeypatch)
    workers = dest._direct.at_decision.workers
    handed = workers._submitted
    identifiers = _second_messages_behind_the_first(s, BEHIND)
    committed = dict(_committed(s, 2 * BEHIND + 1))
    assert sorted(committed) == sorted(["first", *(f"o{n}" for n in range(BEHIND)), *(f"n{n}" for n in range(BEHIND))])
    assert len({committed[f"n{n}"] for n in range(BEHIND)}) == 1  # one global transaction
    assert dest.receipts_at_commit - before == BEHIND
    # the batch's store branch: the commit whose mark names its gtrid (the part after the node)
    mark = bytes.fromhex(committed["n0"]).split(b"|", 1)[1].decode()
    (pid,) = {pid for pid in marked if any(f"'{mark}'" in text for text in _sent(pg_server.log_path, offset, pid))}
    sent = _sent(pg_server.log_path, offset, pid)
    (last,) = (i for i, text in enumerate(sent) if f"'{mark}'" in text)
    assert sent[last].startswith("BEGIN;"), sent[last - 2:last + 1]
    assert sent[last].count("UPDATE rmd_sequence") == BEHIND, sent[last]  # each receipt: one statement
    # in the order of the batch's parts (by identifier), as the general way locks its rows: given in
    # front of each other, they locked their sequences in the other order, against another batch's
    places = [sent[last].index(f"'{identifier}'") for identifier in identifiers]
    assert places == sorted(places), (identifiers, sent[last])
    # each batch's phase 2 (the application's COMMIT PREPARED) run by its leader, none handed to a worker
    assert workers._submitted == handed
    assert dest.receipts_declined_at_commit == 0
    assert all(calls == 1 for calls in s.ledger.calls.values())
    with s.server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_receipt_found_wrong_at_a_batchs_marked_commit_rolls_both_branches_back_and_each_goes_alone(served) -> None:
    """The last sequence's row changed behind the service's back: its receipt, riding on the
    batch's marked commit, fails there on purpose; the store's branch rolls back, and the
    application's prepared branch with it (no mark: nothing decided).  Each receive of the batch
    then goes again alone, the general way: every message committed once, the batch's
    applications run twice, nothing left prepared."""
    s = served()
    dest = s.server.destination
    _second_messages_behind_the_first(s, BEHIND, wrong=BEHIND - 1)
    expected = sorted(["first", *(f"o{n}" for n in range(BEHIND)), *(f"n{n}" for n in range(BEHIND))])
    assert wait_for(lambda: sorted(item for item, _ in rows(s.app_db)) == expected, timeout=30), rows(s.app_db)
    assert Counter(item for item, _ in rows(s.app_db)) == Counter(expected)  # each exactly once
    assert dest.receipts_declined_at_commit == 1
    assert [s.ledger.calls[f"n{n}"] for n in range(BEHIND)] == [2] * BEHIND
    with s.server.store.begin() as tx:
        assert tx.invoker.count() == 0


def test_a_buffered_receipt_does_not_turn_the_batches_receipts_at_the_commit_off(served) -> None:
    """Receive together left automatic (on while deliveries commit in two phases): a receipt that
    delivered nothing (message 3 before 2: buffered) no longer says the deliveries commit in one
    phase, so the next message of another sequence goes through the batches, not the receipt at
    the commit of one delivering alone (which in two phases refused and turned every receipt at
    the commit off for the process's life: the batches' too).  Each committed once."""
    s = served(receive_together=None)
    dest = s.server.destination
    assert dest._together is not None and dest._together_if_two_phase
    s.release.set()
    a, b = open_sequence(s.url, RM11), open_sequence(s.url, RM11)
    send_ok(s.url, RM11, a, 1, "a1")
    assert wait_for(lambda: a in dest._foreseen, timeout=30)
    assert send_ok(s.url, RM11, b, 2, "b2") == [(2, 2)]  # buffered: its message 1 has not come
    for number in (2, 3):
        before = dest.receipts_at_commit
        send_ok(s.url, RM11, a, number, f"a{number}")
        assert wait_for(lambda before=before: dest.receipts_at_commit > before, timeout=30)
    send_ok(s.url, RM11, b, 1, "b1")
    expected = ["a1", "a2", "a3", "b1", "b2"]
    assert wait_for(lambda: sorted(item for item, _ in rows(s.app_db)) == expected, timeout=30), rows(s.app_db)
    assert Counter(item for item, _ in rows(s.app_db)) == Counter(expected)  # each exactly once

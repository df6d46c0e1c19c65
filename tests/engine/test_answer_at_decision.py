"""Under XA across two databases, a delivery on receipt is answered at its commit decision
(``RMPolicy.answer_at_decision``): the store's branch committed with the commit mark, the
application's still prepared; a worker commits it after.  The sequence's next delivery waits for
that, so its application sees the rows of the last one.

Everything is real (two PostgreSQL databases, HTTP on 127.0.0.1); the phase-2 workers are
replaced by a holder that runs each job when the test says, so each step is seen as it is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from tests.postgres.support import prepared_gids
from tests.postgres.test_commit_at_decision import Held
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import ReliableEngine

from .support import RM11, item_text, wait_for
from .test_bad_input import open_sequence, send_ok
from .test_delivery_xa_batch import rows, xa_application
from .test_receive_together_xa import xa_server

pytestmark = pytest.mark.postgres


@dataclass
class Reader:
    """The application: counts the rows it can see, then writes its own, in the delivery's
    global transaction (its database is not the store's)."""

    tm: TransactionManager
    ds: XADataSource
    seen: dict[str, int] = field(default_factory=dict)

    def __call__(self, envelope: bytes, context: object) -> None:
        item = item_text(envelope)
        gtrid = self.tm.get_transaction().xid.gtrid.hex()
        with self.ds.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM received")
            self.seen[item] = cur.fetchone()[0]
            cur.execute("INSERT INTO received (item, gtrid) VALUES (%s, %s)", (item, gtrid))


@pytest.fixture
def served(pg_dsn_factory, tmp_path) -> Iterator[Callable[..., tuple[ReliableEngine, Reader, str]]]:
    closers: list[Callable[[], None]] = []

    def make(**policy) -> tuple[ReliableEngine, Reader, str]:
        app_db, tm, ds = xa_application(pg_dsn_factory, tmp_path / f"tm{len(closers)}.log", closers,
                                        node="at-decision")
        reader = Reader(tm, ds)
        policy.setdefault("receive_together", 1)
        server = xa_server(pg_dsn_factory, tm, reader, closers, **policy)
        return server, reader, app_db

    yield make
    for close in reversed(closers):
        close()


def test_a_delivery_is_answered_at_its_decision_and_the_next_waits_for_its_rows(served) -> None:
    server, reader, app_db = served()
    at_decision = server.invoker.at_decision
    assert at_decision is not None
    held = Held()
    at_decision.workers = held  # type: ignore[assignment]
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)

    # answered (acknowledged) while the application's branch is still prepared
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 1)]
    assert rows(app_db) == [] and len(prepared_gids(app_db)) == 1  # without: the row, nothing prepared
    assert len(held.jobs) == 1

    # the next message of the sequence: received, its application waits for that phase 2
    answered: list = []
    second = threading.Thread(target=lambda: answered.append(send_ok(url, RM11, identifier, 2, "two")))
    second.start()
    try:
        assert wait_for(lambda: at_decision.waiting == 1, timeout=30)
        assert "two" not in reader.seen
        assert held.run_all() == 1
        assert wait_for(lambda: answered, timeout=30)
    finally:
        held.run_all()
        second.join(30)
    assert answered == [[(1, 2)]]
    assert reader.seen == {"one": 0, "two": 1}  # it saw message 1's row (0 without the wait)
    held.run_all()  # message 2's phase 2 (run already by the ``finally`` above, or now)
    assert [item for item, _ in rows(app_db)] == ["one", "two"] and prepared_gids(app_db) == []


def test_off_the_answer_waits_for_every_branch(served) -> None:
    server, reader, app_db = served(answer_at_decision=False)
    assert server.invoker.at_decision is None
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    assert send_ok(url, RM11, identifier, 1, "one") == [(1, 1)]
    assert [item for item, _ in rows(app_db)] == ["one"] and prepared_gids(app_db) == []


def test_other_sequences_do_not_wait(served) -> None:
    """Only a sequence's own next delivery waits: another sequence's goes on while the first's
    phase 2 is held."""
    server, reader, app_db = served()
    held = Held()
    server.invoker.at_decision.workers = held  # type: ignore[union-attr]
    url = server.endpoint_address
    first, other = open_sequence(url, RM11), open_sequence(url, RM11)
    assert send_ok(url, RM11, first, 1, "one") == [(1, 1)]
    assert send_ok(url, RM11, other, 1, "other") == [(1, 1)]
    assert reader.seen == {"one": 0, "other": 0}
    assert held.run_all() == 2
    assert sorted(item for item, _ in rows(app_db)) == ["one", "other"]


def test_stop_waits_for_the_phase_two_it_handed_over(served) -> None:
    """An engine stopping runs (waits for) what it answered at the decision: nothing of it is left
    prepared for recovery."""
    server, reader, app_db = served()
    held = Held()
    server.invoker.at_decision.workers = held  # type: ignore[union-attr]
    url = server.endpoint_address
    assert send_ok(url, RM11, open_sequence(url, RM11), 1, "one") == [(1, 1)]
    assert len(prepared_gids(app_db)) == 1
    server.stop(timeout=5)
    assert [item for item, _ in rows(app_db)] == ["one"] and prepared_gids(app_db) == []  # prepared without

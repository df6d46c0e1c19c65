"""What one sequential request-reply call costs the stores: transactions and fsyncs, counted.

Real parts: a reliable spyne service and a reliable zeep client over loopback HTTP, on memory and
SQLite stores.  The client's caller enqueues its request and claims it for its own send in one
transaction, and records the reply in another, which acknowledges the request once (with the
acknowledgement riding on the reply).  The service receives a back-channel request, applies the
acknowledgement riding on it, delivers it and takes its reply for the HTTP response in one
transaction (the acknowledgement the response carries is the one that receive made); a SQLite
client records the reply, which answers its caller, without waiting for the disk there, so each
call waits for one client fsync (its request's enqueue), and whatever reads the reply's record
(the acknowledgement the next request carries) waits for the disk first.  Counts, never time;
each call waits for its answer (a few seconds for the file).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.engine import invoker as invoker_module
from wsrm_plugin.engine import retransmission
from wsrm_plugin.store import memory
from wsrm_plugin.store.sql import rms as sql_rms

from . import service
from .conftest import fast_policy

CALLS = 8
#: a grace and a retransmission interval long enough that nothing but the caller sends a request
QUIET = dict(caller_send_grace=30.0, base_retransmission_interval=30.0)


def _store(kind: str, tmp_path: Any, role: str) -> str:
    return "memory:" if kind == "memory" else f"sqlite:///{tmp_path}/{role}.db"


@pytest.fixture(params=["memory", "sqlite"])
def pair(request: Any, tmp_path: Any) -> Iterator[tuple[Any, Any]]:
    service.reset()
    svc = reliable_service(service.spyne_app(), _store(request.param, tmp_path, "service"), fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), _store(request.param, tmp_path, "client"),
                         fast_policy(**QUIET))
    try:
        yield svc, rc
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)


def _count_commits(store: Any) -> Counter[str]:
    """Commits of ``store``, by the name of the thread that made them (waitress's threads
    counted as one)."""
    counts: Counter[str] = Counter()
    finish = store._finish

    def counting(tx: Any, commit: bool) -> None:
        name = threading.current_thread().name
        counts["receiving" if name.startswith("waitress") else name] += 1
        finish(tx, commit)
    store._finish = counting
    return counts


def test_the_service_answers_a_call_with_the_reply_its_receipt_took_in_its_own_transaction(pair, monkeypatch):
    svc, rc = pair
    # every reply's acknowledgement rides on the next request, however slow a loaded machine
    # makes the caller (else it goes on its own after 50 ms: a transaction more on the service)
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    # and a stall of the loaded machine does not make the application count as slow (its moving
    # average above QUICK_APPLICATION sends requests through the buffer, by design: 6 of 10
    # delivered on receipt in a run beside other tests)
    monkeypatch.setattr(invoker_module, "QUICK_APPLICATION", 60.0)
    # the first opens the sequences, the second's riding acknowledgement fills the service's
    # caches of who owns the sequences it names
    assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(2)] == ["re:q0", "re:q1"]
    handed_out = svc.engine.back_channel.handed_out
    # the first request may be the sender's (sent once its sequence is created) or its caller's
    # (whose wait began after that): counted from here
    sent_by_callers = rc.engine.retransmission.sent_by_callers
    commits = _count_commits(svc.engine.store)
    client_commits = _count_commits(rc.engine.store)
    caller = threading.current_thread().name
    acknowledged: Counter[str] = Counter()  # acknowledgements applied to the client's requests
    for manager in (memory._RmsMessages, sql_rms._RmsMessages):
        def counting(self: Any, *args: Any, _real: Any = manager.acknowledge, **kwargs: Any) -> Any:
            acknowledged[threading.current_thread().name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(manager, "acknowledge", counting)
    for i in range(2, CALLS + 2):
        assert rc.service.echo(f"q{i}").result(timeout=60) == f"re:q{i}"
    assert svc.engine.back_channel.handed_out - handed_out == CALLS
    assert svc.engine.destination.delivered_on_receipt == CALLS + 2
    # per call one: the receipt records the request, applies the acknowledgement of the previous
    # reply that rides on it, delivers it and takes its reply; the acknowledgement was not applied,
    # the reply not looked for, nor the acknowledgement read in transactions of their own (4 before)
    assert commits["receiving"] == CALLS, commits
    assert svc.engine.store.status().unacked <= 1  # the riding acknowledgements freed every reply but the last
    # the caller's two: its request's enqueue, which claims it for the caller's send too (the
    # first attempt recorded, the acknowledgements of the previous exchange applied), and the
    # reply's record, which consumes it (3 before: the claim was a transaction of its own)
    assert client_commits[caller] == 2 * CALLS, client_commits
    assert rc.engine.retransmission.sent_by_callers - sent_by_callers == CALLS
    # each request acknowledged once, by the reply's record with the acknowledgement riding on
    # the reply, once that marked it answered (twice before: the riding acknowledgement left it
    # unacknowledged while its reply was pending, then the reply's consumption acknowledged it)
    assert acknowledged[caller] == CALLS, acknowledged
    assert service.ECHOED == [f"q{i}" for i in range(CALLS + 2)]


def test_a_sqlite_client_waits_for_one_fsync_per_call_and_acknowledges_replies_only_from_disk(tmp_path):
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), f"sqlite:///{tmp_path}/client.db", fast_policy(**QUIET))
    try:
        assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(2)] == ["re:q0", "re:q1"]
        store, caller = rc.engine.store, threading.current_thread().name
        later: list[bool] = []  # the caller's commits: does each return before its disk wait?
        fsyncs: list[str] = []
        finish, fsync = store._finish, store._sync._fsync

        def finishing(tx, commit):
            if threading.current_thread().name == caller:
                later.append(bool(getattr(tx, "returns_before_disk", False)))
            finish(tx, commit)

        def syncing():
            fsyncs.append(threading.current_thread().name)
            fsync()
        store._finish, store._sync._fsync = finishing, syncing
        for i in range(2, CALLS + 2):
            assert rc.service.echo(f"q{i}").result(timeout=60) == f"re:q{i}"
        # per call the enqueue (which waits for its fsync) and the reply's record, which answers
        # the caller without waiting (the next enqueue's fsync covers it)
        assert later == [False, True] * CALLS, later
        # so the caller's thread runs at most one fsync per call (2 before); another thread's
        # fsync may cover its enqueue
        assert fsyncs.count(caller) <= CALLS, fsyncs
        # what reads the records waits for the disk: the replies' acknowledgement goes on its own
        # after 50 ms with no request to carry it, and the service then frees the replies
        assert wait_for(lambda: svc.engine.store.status().unacked == 0, timeout=30)
        assert store._sync._synced >= store._sync._needed
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)

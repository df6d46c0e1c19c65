"""How many HTTP threads a service gets, and a PostgreSQL service given many receiving at once.

Each receive on PostgreSQL waits in its HTTP thread for its durable commit, a WAL flush that
the commits of other sessions at the same moment share: the thread count bounds how many
receives one flush covers.  ``serve()`` gives a service 4 threads
(``ReliableEngine.http_threads``: 16 cost more in thread switches than they saved in flushes on
a quiet 2-core machine), 8 where one-way messages are buffered and the HTTP threads deliver them
after their responses (memory), and ``threads=`` decides when given.

The end-to-end case: a PostgreSQL service served with 16 threads; 12 sequences send their
first message at once; the method (run in the receiving thread: ``deliver_on_receive``; one
invoker thread for what the destination buffers) waits until all 12 are in it.  With 4 threads
at most 5 could be, and nothing would be delivered until the barrier gave up.
"""

from __future__ import annotations

import threading

import zeep
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.engine import ReliableEngine, RMPolicy

from .conftest import fast_policy

TNS = "urn:wsrm-http-threads"
AT_ONCE = 12

_met: list[str] = []
_barrier = threading.Barrier(AT_ONCE, timeout=60)


class _Meeting(ServiceBase):
    @rpc(Unicode, _returns=None)
    def meet(ctx, item):  # noqa: N805 -- spyne's signature
        _barrier.wait()  # every message in a receiving thread at the same moment
        _met.append(item)


def _application() -> Application:
    return Application([_Meeting], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


def _meet_side_by_side(svc, server) -> None:
    """Start ``svc`` (served by ``server``, 16 threads), send AT_ONCE sequences' first messages,
    and wait until every one met the others in the method; both ends stopped."""
    svc.start()
    keys = [f"k{n}" for n in range(AT_ONCE)]
    first = reliable_client(zeep.Client(svc.url + "?wsdl"), "memory:", fast_policy(), key=keys[0],
                            active_keys=keys)
    try:
        assert server.threads == 16
        clients = [first, *(first.with_key(key) for key in keys[1:])]
        for n, rc in enumerate(clients):
            rc.service.meet(f"item-{n}")
        assert wait_for(lambda: len(_met) == AT_ONCE, timeout=90), (
            f"{len(_met)} of {AT_ONCE} delivered (broken barrier: {_barrier.broken})")
        assert sorted(_met) == sorted(f"item-{n}" for n in range(AT_ONCE))
    finally:
        first.stop(timeout=60)  # waits only for acknowledgements still on their way (a loaded machine)
        svc.stop(timeout=5)


def test_sequences_are_received_side_by_side_on_postgresql(pg_dsn_factory):
    _met.clear()
    _barrier.reset()
    svc = reliable_service(_application(), f"postgresql:{pg_dsn_factory('threads')}",
                           fast_policy(deliver_on_receive=True, invoker_threads=1))
    assert svc.engine.http_threads == 4  # the default, on PostgreSQL too
    server = svc.serve(threads=16)
    _meet_side_by_side(svc, server)


def test_a_sqlite_service_delivering_apart_runs_its_applications_side_by_side(tmp_path):
    """Delivering apart, each receive runs its application in its HTTP thread outside the file:
    served with the automatic count, 12 sequences' first messages meet in the method at once
    (with 4 threads at most 4 could, and nothing would be delivered until the barrier gave up)."""
    _met.clear()
    _barrier.reset()
    svc = reliable_service(_application(), f"sqlite:///{tmp_path}/apart.db",
                           fast_policy(deliver_on_receive=True, deliver_apart=True, invoker_threads=1))
    assert svc.engine.http_threads == 16
    server = svc.serve()
    _meet_side_by_side(svc, server)


def test_memory_buffering_gets_eight_threads_sqlite_four_and_threads_given_win(tmp_path):
    memory = ReliableEngine("memory:")
    sqlite = ReliableEngine(f"sqlite:///{tmp_path}/s.db")
    apart = ReliableEngine(f"sqlite:///{tmp_path}/a.db", RMPolicy(deliver_apart=True))
    automatic = ReliableEngine(f"sqlite:///{tmp_path}/b.db", RMPolicy(deliver_apart=None))
    on_memory = ReliableEngine("memory:", RMPolicy(deliver_apart=True))  # never apart there
    on_receipt = ReliableEngine("memory:", RMPolicy(deliver_on_receive=True))
    try:
        # one-way messages buffered, each HTTP thread delivering after its response: 8 of each
        assert memory.http_threads == 8
        assert len([w for w in memory._workers if "invoker" in w.name]) == 8
        assert memory.invoker._step_slots.qsize() == memory.invoker.thread_count == 8
        assert sqlite.http_threads == 4  # delivering inside (the default): the file bounds the rate
        assert apart.http_threads == 16  # the applications run outside the file, one a thread
        assert automatic.http_threads == 16
        assert on_memory.http_threads == 8
        # delivered in the receive: the HTTP threads run the applications, 4 and 4 as on PostgreSQL
        assert on_receipt.http_threads == 4
        assert on_receipt.invoker._step_slots.qsize() == on_receipt.invoker.thread_count == 4
        server = memory.serve(threads=2)
        assert server.threads == 2
    finally:
        for engine in (memory, sqlite, apart, automatic, on_memory, on_receipt):
            engine.stop(timeout=5)

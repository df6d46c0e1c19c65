"""ReliableService.start(): the lifecycle listener, and recovery that keeps running (issue 4)."""

from __future__ import annotations

import pytest

from interceptors import hookimpl
from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.xa import TMNOFLAGS, TMSUCCESS, XA_OK
from txmanager.xid import Xid
from wsrm_plugin.store import LockTimeoutError
from wsrm_plugin.store.memory import MemoryStore

from . import service
from .conftest import fast_policy


class _Listener:
    def __init__(self) -> None:
        self.reports: list[tuple[object, object]] = []

    @hookimpl
    def wsrm_lifecycle_started(self, engine, report):
        self.reports.append((engine, report))


def test_start_runs_the_lifecycle_listener_and_announces_it(servers):
    from interceptors.chain import InterceptorChain

    chain = InterceptorChain([], load_entry_points=False)
    listener = _Listener()
    chain.register_plugin(listener)
    server = servers(chain=chain)
    assert server.lifecycle_report is not None
    assert listener.reports == [(server.engine, server.lifecycle_report)]
    server.start()  # idempotent: the start-up pass runs once
    assert len(listener.reports) == 1


def test_background_recovery_unblocks_the_store_without_a_restart(servers, tmp_path):
    store = MemoryStore(lock_timeout=0.2)
    with store.begin() as tx:
        tx.rms.create("held", target="http://127.0.0.1:9/", acks_to="urn:x", rm_version="v", wsa_version="w")
    tm = TransactionManager(node="anon-test", log=tmp_path / "tm.log", safety_interval=0.5)
    # a transaction of this node that "crashed" after its store branch prepared, before any decision
    xa = store.xa_resource()
    xid = Xid.new_global(tm.node).branch(b"1")
    xa.start(xid, TMNOFLAGS)
    xa.transaction_of(xid).rms.update("held", last_activity=1.0)
    xa.end(xid, TMSUCCESS)
    assert xa.prepare(xid) == XA_OK
    try:
        server = servers(store=store, tm=tm, recovery_interval=0.1)
        assert server.lifecycle_report.recovery is not None
        with pytest.raises(LockTimeoutError):  # the prepared branch holds the sequence
            with store.begin() as tx:
                tx.rms.get("held")
        # past the safety interval the running service's recovery presumes it aborted
        assert wait_for(lambda: xa.recover() == [], timeout=30)
        with store.begin() as tx:
            assert tx.rms.get("held").last_activity != 1.0
        server.stop(timeout=5)
        assert not tm.recovery.running  # the service stops the recovery it started
    finally:
        tm.close()


def test_recovery_interval_needs_a_transaction_manager():
    from interceptors.spyne_server.service import reliable_service

    with pytest.raises(ValueError, match="transaction manager"):
        reliable_service(service.application(), "memory:", fast_policy(), recovery_interval=1.0)
    with pytest.raises(ValueError, match="recovery_interval"):
        reliable_service(service.application(), "memory:", fast_policy(), tm=object(), recovery_interval=0)

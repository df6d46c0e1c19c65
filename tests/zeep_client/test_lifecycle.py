"""The lifecycle listener: a SIGKILLed client resumes on its SQLite store; orphans are terminated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path


from tests.engine.support import wait_for
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.source import SequenceKey
from wsrm_plugin.engine.transport import free_port
from wsrm_plugin.lifecycle import LifecycleListener
from interceptors import hookimpl

from . import service
from .conftest import fast_policy

ROOT = Path(__file__).resolve().parents[2]
CALLBACK = "tests.zeep_client.service:append_reply"


def _start_client(wsdl: Path, store: str, port: int, mode: str, count: int, reply_file: Path, *,
                  callback: str = CALLBACK, **env: str) -> subprocess.Popen:
    env = {**os.environ, "WSRM_REPLY_FILE": str(reply_file), "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen([sys.executable, "-m", "tests.zeep_client.client_proc", str(wsdl), store, str(port),
                             mode, str(count), callback], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_killed_client_restarts_and_every_reply_reaches_the_callback_once(tmp_path):
    service.reset()
    gate = threading.Event()  # the service holds its replies back until the first client is dead
    receiver = service.SpyneReceiver()
    started = []

    def held(envelope, context):
        started.append(context.message_id)
        assert gate.wait(60), "gate never opened"
        receiver(envelope, context)

    server = ReliableEngine("memory:", fast_policy(), application=held, name="server")
    server.serve(middleware=receiver.middleware)
    server.start()
    wsdl = tmp_path / "service.wsdl"
    wsdl.write_bytes(urllib.request.urlopen(server.endpoint_address + "?wsdl", timeout=10).read())
    store, port, replies = f"sqlite:///{tmp_path}/client.db", free_port(), tmp_path / "replies.txt"
    procs: list[subprocess.Popen] = []
    try:
        first = _start_client(wsdl, store, port, "send", 6, replies)
        procs.append(first)
        assert first.stdout.readline().strip() == "sent"
        assert wait_for(lambda: len(started) >= 1)  # the server has the calls: replies are on their way
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        gate.set()  # replies now go to a dead listener and are retransmitted

        second = _start_client(wsdl, store, port, "resume", 0, replies)
        procs.append(second)
        report = json.loads(second.stdout.readline())
        assert CALLBACK in report["restored"] and report["missing"] == {}
        assert report["pending"] >= 1
        assert wait_for(lambda: len(_lines(replies)) >= 6, timeout=60), _lines(replies)
        assert wait_for(lambda: server.status().unacked == 0, timeout=60)
        assert sorted(_lines(replies)) == sorted(f"re:q{i} c{i}" for i in range(6))
        assert service.ECHOED == [f"q{i}" for i in range(6)]
    finally:
        gate.set()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        server.stop(timeout=5)


def test_a_reply_whose_callback_ran_just_before_a_sigkill_is_handled_once_after_the_restart(tmp_path):
    """The callback wrote its line; the process died before the delivery committed.  After the
    restart the reply comes to the callback again, flagged ``redelivered``: it finds its own line
    by the request's MessageID and does not write a second one."""
    service.reset()
    receiver = service.SpyneReceiver()
    server = ReliableEngine("memory:", fast_policy(), application=receiver, name="server")
    server.serve(middleware=receiver.middleware)
    server.start()
    wsdl = tmp_path / "service.wsdl"
    wsdl.write_bytes(urllib.request.urlopen(server.endpoint_address + "?wsdl", timeout=10).read())
    store, port, replies = f"sqlite:///{tmp_path}/client.db", free_port(), tmp_path / "replies.txt"
    hung = tmp_path / "hung"
    idempotent = "tests.zeep_client.service:append_reply_idempotent"
    procs: list[subprocess.Popen] = []
    try:
        first = _start_client(wsdl, store, port, "send", 3, replies, callback=idempotent,
                              WSRM_HANG_IN_CALLBACK=str(hung))
        procs.append(first)
        assert first.stdout.readline().strip() == "sent"
        assert wait_for(hung.exists, timeout=60)  # one callback did its work, its delivery is not committed
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert len(_lines(replies)) == 1

        second = _start_client(wsdl, store, port, "resume", 0, replies, callback=idempotent)
        procs.append(second)
        json.loads(second.stdout.readline())
        assert wait_for(lambda: len({line.split()[-1] for line in _lines(replies)}) >= 3, timeout=60)
        assert wait_for(lambda: server.status().unacked == 0, timeout=60)
        redelivered = _lines(Path(f"{replies}.redelivered"))
        assert _lines(replies)[0].split()[0] in redelivered  # the killed one came again, flagged
        assert sorted(line.split(" ", 1)[1] for line in _lines(replies)) == [f"re:q{i} c{i}" for i in range(3)]
        assert len({line.split()[0] for line in _lines(replies)}) == 3  # each request's reply handled once
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        server.stop(timeout=5)


def test_a_client_records_each_reply_before_its_callback_runs(clients, tmp_path):
    """What ``redelivered`` rests on: a reply handed over in the transaction that receives it
    would, after a crash in its callback, come again as a new one (unflagged).  So a client
    delivers replies through its store unless its policy asks otherwise, with or without a
    transaction manager, on every store."""
    from txmanager import TransactionManager

    tm = TransactionManager(node="replies", log=tmp_path / "tm.log")
    try:
        for i, options in enumerate(({}, {"tm": tm})):
            rc = clients(f"sqlite:///{tmp_path}/c{i}.db", name=f"c{i}", **options)
            assert rc.engine.destination._direct is None
        on = clients(f"sqlite:///{tmp_path}/on.db", fast_policy(deliver_on_receive=True), name="on")
        assert on.engine.destination._direct is not None  # asked for: the caller's trade-off
    finally:
        tm.close()


class Seen:
    def __init__(self) -> None:
        self.reports = []

    @hookimpl
    def wsrm_lifecycle_started(self, engine, report):
        self.reports.append(report)


def test_orphaned_sequences_are_terminated_and_listeners_told(clients, server, tmp_path):
    store = f"sqlite:///{tmp_path}/client.db"
    old = clients(store, key="old", name="old")
    old.service.record("from-old")
    assert wait_for(lambda: service.RECEIVED == ["from-old"])
    old.stop(timeout=5)  # stopped without closing: its sequence stays open in the store

    seen = Seen()
    from interceptors import InterceptorChain
    chain = InterceptorChain([], load_entry_points=False)
    chain.register_plugin(seen)
    new = clients(store, key="new", name="new", chain=chain)
    assert len(new.lifecycle_report.orphans_terminated) == 1
    assert SequenceKey.decode(new.lifecycle_report.orphans_terminated[0]).key == "old"
    assert seen.reports == [new.lifecycle_report]
    new.service.record("from-new")
    assert wait_for(lambda: service.RECEIVED == ["from-old", "from-new"])
    keys = lambda: {SequenceKey.decode(s.key).key for s in new.engine.store.status().rms}  # noqa: E731
    assert wait_for(lambda: "old" not in keys()), keys()
    assert keys() == {"new"}


def test_missing_callback_is_reported_at_start(tmp_path):
    engine = ReliableEngine(f"sqlite:///{tmp_path}/c.db", fast_policy(), endpoint_address="http://127.0.0.1:9/")
    try:
        engine.send("http://127.0.0.1:9/", service_envelope(), action="urn:x", key="k",
                    reply_callback="no_such_module_xyz:handler", reply_context=None)
        report = LifecycleListener(engine, active_keys={"k"}).on_start()
        assert "no_such_module_xyz:handler" in report.callbacks_missing
        assert report.replies_pending == 1
    finally:
        engine.stop()


def service_envelope() -> bytes:
    from tests.engine.support import payload
    return payload("x")

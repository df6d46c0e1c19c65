"""A reliable zeep client process for the crash test (killed with SIGKILL, then restarted).

``python -m tests.zeep_client.client_proc WSDL_FILE STORE_URL PORT send N`` enqueues N in-out calls
with a persisted callback (``append_reply``, or the import path given as a 6th argument), prints
``sent`` and waits to be killed; ``... resume 0`` only starts (the
lifecycle listener restores callbacks and resumes), prints the lifecycle report as JSON and waits.
``... futures N`` makes N in-out calls one after the other, each waiting for its future (no
callback: the reply is consumed by its record), printing ``answer TEXT`` for each, then waits.  A
PORT of 0 serves no listener: the replies come in the HTTP responses.  ``... xa N`` (a PostgreSQL
store URL) makes N such calls each inside a global transaction that first inserts the call's text
into the store database's ``orders`` table (one database: the request's enqueue rides on the
COMMIT), printing ``answer TEXT`` for each; with ``xa`` as the mode of ``resume`` too (``resume-xa``)
the restarted client has the same transaction manager (its recovery log beside the WSDL file).
``... xa-held N`` makes N such calls, then one more whose reply's record (after its answer: see
``Destination.answer_before_record``) never comes, nor that of a copy the sender's retransmission
brings back, prints its answer too and waits: killed then, the client dies between a call's
answer and its reply's record.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import zeep

from wsrm_plugin.engine import RMPolicy
from interceptors.zeep_client.client import reliable_client

POLICY = RMPolicy(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05,
                  http_timeout=5.0)


def main() -> None:
    wsdl, store, port, mode, count = sys.argv[1:6]
    callback = sys.argv[6] if len(sys.argv) > 6 else "tests.zeep_client.service:append_reply"
    listen = ("127.0.0.1", int(port)) if int(port) else None
    tm = ds = None
    if mode in ("xa", "resume-xa", "xa-held"):
        from txmanager import TransactionManager
        from txmanager.postgres import XADataSource
        tm = TransactionManager(node="crash-client", log=Path(wsdl).parent / "tm.log")
        ds = XADataSource(store.removeprefix("postgresql:"), tm)
    rc = reliable_client(zeep.Client(wsdl), store, POLICY, listen=listen, key="orders", name="crash-client", tm=tm)
    if mode in ("xa", "xa-held"):
        assert tm is not None and ds is not None
        calls = int(count) + (mode == "xa-held")
        for i in range(calls):
            if mode == "xa-held" and i == calls - 1:
                rc.engine.destination.wait_records()  # the calls before recorded: only the last is held
                _hold_records()
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO orders VALUES (%s)", (f"q{i}",))
                future = rc.service.echo(f"q{i}")
            print("answer", future.result(timeout=60), flush=True)
    elif mode == "futures":
        for i in range(int(count)):
            print("answer", rc.service.echo(f"q{i}").result(timeout=60), flush=True)
    elif mode == "send":
        for i in range(int(count)):
            rc.service.echo(f"q{i}", _callback=callback, _context=f"c{i}")
        print("sent", flush=True)
    else:
        report = rc.lifecycle_report
        print(json.dumps({"restored": report.callbacks_restored, "missing": report.callbacks_missing,
                          "pending": report.replies_pending}), flush=True)
    while True:
        time.sleep(1)


def _hold_records() -> None:
    """From now on no reply is recorded off the caller's thread: a reply answered before its
    record never is (its records' thread waits), nor is a copy of it that the sender's
    retransmission of its request brings back (the sender's thread waits).  The caller's own
    thread still records (with ``answer_before_record`` off it does, and the test sees it)."""
    import threading

    from wsrm_plugin.engine import inbound

    never = threading.Event()
    receive = inbound.Inbound._receive

    def held(self: inbound.Inbound, *args: object) -> object:
        if threading.current_thread() is threading.main_thread():
            return receive(self, *args)  # type: ignore[arg-type]
        never.wait()
        raise AssertionError("never let go")
    inbound.Inbound._receive = held  # type: ignore[method-assign]


if __name__ == "__main__":
    main()

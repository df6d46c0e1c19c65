"""In-only with SQLite stores while client and server crash (seed 004, 4.2 "Persistence").

What it shows: rows of an APPLICATION_CLIENT table travel to an
APPLICATION_SERVER table over WS-RM, between two processes that are killed
with SIGKILL and restarted mid-run.  Both WS-RM stores are SQLite files, so
sequences and messages outlive the processes: the restarted client resumes
its sequence and retransmits what was not acknowledged, the restarted server
delivers what it had received and acknowledged.  Nothing is lost.

What persistence alone does NOT give (the seed saw messages lost and
duplicated here): the application's own database and the WS-RM store commit
separately.  A client killed after enqueueing a row but before marking it
sent enqueues it again after the restart; a server killed after its insert
but before the store's delivery commit gets the message again.  So this
example's receiver is idempotent: it inserts a row only if that row's id is
not there yet, and counts the redeliveries it recognised.  With XA
(``xa_client_server.py``) the application database and the store commit
together and no such check is needed.

Run it::

    python examples/persistent_in_only.py [--messages 20] [--kills 4] [--workdir DIR]

It runs ``python persistent_in_only.py server|client ...`` as child
processes.  The last line reads ``delivered N of N, lost 0, duplicated 0``;
exit status 0 only when every row arrived exactly once.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _support import (
    Peer, crash_and_restart, example_policy, free_port, quiet_logging, report, serve_until_stdin_closes, wait_for,
)

TNS = "urn:wsrm-example:persistent"
KEY = "application-client"


# -- the two application databases -------------------------------------------------------------

def _db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)  # explicit BEGIN/COMMIT below
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def create_databases(workdir: Path, messages: int) -> None:
    with _db(workdir / "application_client.db") as conn:
        conn.execute("CREATE TABLE application_client (id INTEGER PRIMARY KEY, message TEXT NOT NULL, "
                     "sent INTEGER NOT NULL DEFAULT 0)")
        conn.executemany("INSERT INTO application_client (id, message) VALUES (?, ?)",
                         [(i, f"message {i}") for i in range(1, messages + 1)])
    with _db(workdir / "application_server.db") as conn:
        conn.execute("CREATE TABLE application_server (id INTEGER NOT NULL, message TEXT NOT NULL)")
        conn.execute("CREATE TABLE redeliveries (id INTEGER NOT NULL)")


def count(path: Path, query: str) -> int:
    conn = _db(path)
    try:
        return conn.execute(query).fetchone()[0]
    finally:
        conn.close()


# -- the server process ------------------------------------------------------------------------

def run_server(workdir: Path, port: int, delay: float) -> None:
    from spyne import Application, Integer, ServiceBase, Unicode, rpc
    from spyne.protocol.soap import Soap11

    from interceptors.spyne_server.service import reliable_service

    class PersistenceInOnlyService(ServiceBase):
        @rpc(Integer, Unicode, _is_async=True)
        def store(ctx, id, message):  # noqa: A002,N805 -- spyne's signature, the client's column name
            conn = _db(workdir / "application_server.db")
            try:
                conn.execute("BEGIN IMMEDIATE")
                if conn.execute("SELECT 1 FROM application_server WHERE id = ?", (id,)).fetchone():
                    conn.execute("INSERT INTO redeliveries (id) VALUES (?)", (id,))  # seen before: keep once
                else:
                    conn.execute("INSERT INTO application_server (id, message) VALUES (?, ?)", (id, message))
                conn.execute("COMMIT")
            finally:
                conn.close()
            time.sleep(delay)  # the window between our commit and the store's, where a crash redelivers

    app = Application([PersistenceInOnlyService], tns=TNS, in_protocol=Soap11(validator="lxml"),
                      out_protocol=Soap11())
    service = reliable_service(app, store=f"sqlite:///{workdir / 'server-rm.db'}", policy=example_policy())
    service.serve("127.0.0.1", port)
    service.start()
    print(f"READY {service.url}", flush=True)
    try:
        serve_until_stdin_closes()
    finally:
        service.stop(timeout=5)


# -- the client process ------------------------------------------------------------------------

def run_client(workdir: Path, delay: float) -> None:
    import zeep

    from interceptors.zeep_client.client import reliable_client

    client = zeep.Client(str(workdir / "service.wsdl"))
    # same store, key and name after a restart: the lifecycle listener resumes the sequence
    rc = reliable_client(client, store=f"sqlite:///{workdir / 'client-rm.db'}", policy=example_policy(),
                         key=KEY, name=KEY)
    print("READY", flush=True)
    conn = _db(workdir / "application_client.db")
    try:
        unsent = conn.execute("SELECT id, message FROM application_client WHERE sent = 0 ORDER BY id").fetchall()
        for id_, message in unsent:
            rc.service.store(id_, message)  # durable in the client's store when it returns
            # a crash right here sends this row again after the restart (the server keeps it once)
            conn.execute("UPDATE application_client SET sent = 1 WHERE id = ?", (id_,))
            time.sleep(delay)
        serve_until_stdin_closes()  # keep retransmitting until the parent says the run is over
    finally:
        conn.close()
        rc.stop(timeout=5)


# -- the run: create, start, crash, restart, check ----------------------------------------------

def run(args: argparse.Namespace, workdir: Path) -> int:
    script = str(Path(__file__).resolve())
    create_databases(workdir, args.messages)
    port = free_port()  # fixed across restarts: the client's sequence is addressed to it
    start_server = lambda: Peer(script, "server", str(workdir), "--port", str(port),  # noqa: E731
                                "--server-delay", str(args.server_delay), log=workdir / "server.log")
    start_client = lambda: Peer(script, "client", str(workdir), "--delay", str(args.delay),  # noqa: E731
                                log=workdir / "client.log")
    peers = {"server": start_server()}
    url = peers["server"].ready
    (workdir / "service.wsdl").write_bytes(urllib.request.urlopen(url + "?wsdl", timeout=30).read())
    peers = {"client": start_client(), **peers}
    client_db, server_db = workdir / "application_client.db", workdir / "application_server.db"
    received = lambda: count(server_db, "SELECT count(DISTINCT id) FROM application_server")  # noqa: E731
    try:
        crash_and_restart(
            peers, {"client": start_client, "server": start_server},
            {"client": lambda: count(client_db, "SELECT count(*) FROM application_client WHERE sent = 1"),
             "server": received},
            total=args.messages, kills=args.kills)
        wait_for(lambda: received() >= args.messages, timeout=args.timeout, interval=0.1)
    finally:
        for peer in peers.values():
            peer.stop()
    conn = _db(server_db)
    try:
        ids = [str(row[0]) for row in conn.execute("SELECT id FROM application_server ORDER BY rowid")]
        redelivered = conn.execute("SELECT count(*) FROM redeliveries").fetchone()[0]
    finally:
        conn.close()
    print(f"the server recognised {redelivered} redeliveries (kept once each)"
          + (f"; logs in {workdir}" if args.workdir else ""))
    return 0 if report([str(i) for i in range(1, args.messages + 1)], ids) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["server"], ["client"]):
        role = argparse.ArgumentParser()
        role.add_argument("role")
        role.add_argument("workdir", type=Path)
        role.add_argument("--port", type=int)
        role.add_argument("--delay", type=float, default=0.05)
        role.add_argument("--server-delay", type=float, default=0.05)
        ns = role.parse_args(argv)
        quiet_logging()
        if ns.role == "server":
            run_server(ns.workdir, ns.port, ns.server_delay)
        else:
            run_client(ns.workdir, ns.delay)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs, alternately client and server")
    parser.add_argument("--delay", type=float, default=0.1, help="client's pause between rows (seconds)")
    parser.add_argument("--server-delay", type=float, default=0.05,
                        help="server's pause after its insert, before the delivery commits")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--workdir", type=Path, help="keep the databases and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            parser.error(f"--workdir {args.workdir} is not empty")
        return run(args, args.workdir.resolve())
    with tempfile.TemporaryDirectory(prefix="wsrm-persistent-") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())

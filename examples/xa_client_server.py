"""Queued transaction processing: XA at both ends of WS-RM, through crashes (seed 004, 4.3 "JTA").

What it shows: rows of an APPLICATION_CLIENT table reach an
APPLICATION_SERVER table over WS-RM, each exactly once, while the client and
the server processes are each killed with SIGKILL and restarted several
times.  Three steps, each atomic:

1. client: one XA transaction marks an APPLICATION_CLIENT row sent AND
   enqueues the message in the RM Source store (``reliable_client(..., tm=tm)``
   makes the enqueue join the caller's transaction);
2. WS-RM moves the message from the client's store to the server's,
   retransmitting until acknowledged;
3. server: one XA transaction, run by the invoker worker, takes the message
   out of the RM Destination store AND inserts the APPLICATION_SERVER row
   (the method's ``XADataSource`` connection joins it).

Both application tables and both stores are in PostgreSQL, and each node has
its own transaction manager with a recovery log: a node killed between
prepare and commit finishes or rolls back its in-doubt branches when it
starts again.  So, unlike ``persistent_in_only.py``, the receiver needs no
duplicate check: APPLICATION_SERVER has no unique constraint and the example
counts every row.

Each node works in its own schema (``client_node``/``server_node`` plus a
run id); in a real deployment they would be separate databases on separate
hosts.  Without ``--dsn`` a throwaway PostgreSQL server is started (and
deleted afterwards); ``--dsn`` uses yours and drops its schemas at the end
(``--keep`` keeps them).

Run it::

    python examples/xa_client_server.py [--messages 30] [--kills 6] [--dsn "host=... dbname=..."]

The last line reads ``delivered N of N, lost 0, duplicated 0``; exit status 0
only when every row arrived exactly once and no transaction was left in doubt.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import make_dsn, parse_dsn

from _support import (
    Peer, crash_and_restart, example_policy, free_port, quiet_logging, report, serve_until_stdin_closes, wait_for,
)

TNS = "urn:wsrm-example:xa"
KEY = "application-client"


def node_dsn(dsn: str, schema: str) -> str:
    """``dsn`` with ``schema`` first on the search path: the node's tables and store live there."""
    options = parse_dsn(dsn).get("options", "")
    return make_dsn(dsn, options=f"{options} -c search_path={schema}".strip())


def query(dsn: str, statement: str, *params: object) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def create_schemas(dsn: str, run_id: str, messages: int) -> tuple[str, str]:
    client_schema, server_schema = f"client_node_{run_id}", f"server_node_{run_id}"
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            for schema in (client_schema, server_schema):
                cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            cur.execute(sql.SQL("CREATE TABLE {}.application_client (id integer PRIMARY KEY, message text NOT NULL, "
                                "sent boolean NOT NULL DEFAULT false)").format(sql.Identifier(client_schema)))
            cur.executemany(sql.SQL("INSERT INTO {}.application_client (id, message) VALUES (%s, %s)")
                            .format(sql.Identifier(client_schema)),
                            [(i, f"message {i}") for i in range(1, messages + 1)])
            # no unique constraint on client_id: a duplicate would show, not be hidden
            cur.execute(sql.SQL("CREATE TABLE {}.application_server (id serial PRIMARY KEY, client_id integer "
                                "NOT NULL, message text NOT NULL)").format(sql.Identifier(server_schema)))
    finally:
        conn.close()
    return node_dsn(dsn, client_schema), node_dsn(dsn, server_schema)


def drop_schemas(dsn: str, run_id: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            for schema in (f"client_node_{run_id}", f"server_node_{run_id}"):
                cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    finally:
        conn.close()


# -- the server node -------------------------------------------------------------------------------

def run_server(workdir: Path, dsn: str, port: int, delay: float) -> None:
    from spyne import Application, Integer, ServiceBase, Unicode, rpc
    from spyne.protocol.soap import Soap11

    from interceptors.spyne_server.service import reliable_service
    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource

    # safety_interval=0: the only other process that used this node name is dead (we were restarted)
    tm = TransactionManager(node="xa-server", log=workdir / "server-tm.log", safety_interval=0)
    application_server = XADataSource(dsn, tm)

    class JTAInOnlyService(ServiceBase):
        @rpc(Integer, Unicode, _is_async=True)
        def store(ctx, id, message):  # noqa: A002,N805 -- spyne's signature, the client's column name
            # this connection is a branch of the invoker's XA transaction, with the dequeue
            with application_server.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO application_server (client_id, message) VALUES (%s, %s)", (id, message))
            time.sleep(delay)  # widen the window a kill lands in, between the insert and the commit

    app = Application([JTAInOnlyService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
    service = reliable_service(app, store=f"postgresql:{dsn}", policy=example_policy(), tm=tm)
    service.serve("127.0.0.1", port)
    service.start()  # recovery first: finishes what a killed predecessor left prepared
    print(f"READY {service.url}", flush=True)
    try:
        serve_until_stdin_closes()
    finally:
        service.stop(timeout=5)
        application_server.close()
        tm.close()


# -- the client node -------------------------------------------------------------------------------

def run_client(workdir: Path, dsn: str, delay: float) -> None:
    import zeep

    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource
    from interceptors.zeep_client.client import reliable_client

    tm = TransactionManager(node="xa-client", log=workdir / "client-tm.log", safety_interval=0)
    application_client = XADataSource(dsn, tm)  # registered for recovery before the client starts
    rc = reliable_client(zeep.Client(str(workdir / "service.wsdl")), store=f"postgresql:{dsn}",
                         policy=example_policy(), tm=tm, key=KEY, name=KEY)  # starts: recovery, then workers
    print("READY", flush=True)
    try:
        unsent = [row[0] for row in query(dsn, "SELECT id FROM application_client WHERE NOT sent ORDER BY id")]
        for id_ in unsent:
            with tm.transaction():  # the row update and the enqueue commit together, or neither does
                with application_client.connection() as conn, conn.cursor() as cur:
                    cur.execute("UPDATE application_client SET sent = true WHERE id = %s AND NOT sent "
                                "RETURNING message", (id_,))
                    row = cur.fetchone()
                if row is not None:
                    rc.service.store(id_, row[0])
            time.sleep(delay)
        serve_until_stdin_closes()  # keep retransmitting until the parent says the run is over
    finally:
        rc.stop(timeout=5)
        application_client.close()
        tm.close()


# -- the run ---------------------------------------------------------------------------------------

def run(args: argparse.Namespace, dsn: str, workdir: Path) -> int:
    script = str(Path(__file__).resolve())
    run_id = uuid.uuid4().hex[:8]
    client_dsn, server_dsn = create_schemas(dsn, run_id, args.messages)
    port = free_port()
    start_server = lambda: Peer(script, "server", str(workdir), server_dsn, "--port", str(port),  # noqa: E731
                                "--server-delay", str(args.server_delay), log=workdir / "server.log")
    start_client = lambda: Peer(script, "client", str(workdir), client_dsn,  # noqa: E731
                                "--delay", str(args.delay), log=workdir / "client.log")
    delivered = lambda: query(server_dsn, "SELECT count(*) FROM application_server")[0][0]  # noqa: E731
    peers: dict[str, Peer] = {}
    try:
        peers["server"] = start_server()
        wsdl = urllib.request.urlopen(peers["server"].ready + "?wsdl", timeout=30).read()
        (workdir / "service.wsdl").write_bytes(wsdl)  # a restarted client must not need the server up
        peers = {"client": start_client(), **peers}
        crash_and_restart(
            peers, {"client": start_client, "server": start_server},
            {"client": lambda: query(client_dsn, "SELECT count(*) FROM application_client WHERE sent")[0][0],
             "server": delivered},
            total=args.messages, kills=args.kills)
        wait_for(lambda: delivered() >= args.messages, timeout=args.timeout, interval=0.1)
    finally:
        for peer in peers.values():
            peer.stop()
    received = [str(row[0]) for row in query(server_dsn, "SELECT client_id FROM application_server ORDER BY id")]
    sent = query(client_dsn, "SELECT count(*) FROM application_client WHERE sent")[0][0]
    in_doubt = query(dsn, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")[0][0]
    print(f"APPLICATION_CLIENT rows marked sent: {sent}; transactions left in doubt: {in_doubt}"
          + (f"; logs in {workdir}" if args.workdir else ""))
    ok = report([str(i) for i in range(1, args.messages + 1)], received)
    if not args.keep:
        drop_schemas(dsn, run_id)
    return 0 if ok and in_doubt == 0 and sent == args.messages else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["server"], ["client"]):
        role = argparse.ArgumentParser()
        role.add_argument("role")
        role.add_argument("workdir", type=Path)
        role.add_argument("dsn")
        role.add_argument("--port", type=int)
        role.add_argument("--delay", type=float, default=0.05)
        role.add_argument("--server-delay", type=float, default=0.05)
        ns = role.parse_args(argv)
        quiet_logging()
        if ns.role == "server":
            run_server(ns.workdir, ns.dsn, ns.port, ns.server_delay)
        else:
            run_client(ns.workdir, ns.dsn, ns.delay)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--kills", type=int, default=6, help="SIGKILLs, alternately client and server")
    parser.add_argument("--delay", type=float, default=0.1, help="client's pause between rows (seconds)")
    parser.add_argument("--server-delay", type=float, default=0.05,
                        help="server's pause after its insert, inside the delivery transaction")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--dsn", help="a PostgreSQL database to use (max_prepared_transactions > 0); "
                                      "default: start a throwaway server")
    parser.add_argument("--keep", action="store_true", help="keep the schemas in --dsn after the run")
    parser.add_argument("--workdir", type=Path,
                        help="keep the WSDL, recovery logs and process logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            parser.error(f"--workdir {args.workdir} is not empty")
        return with_database(args, args.workdir.resolve())
    with tempfile.TemporaryDirectory(prefix="wsrm-xa-") as tmp:
        return with_database(args, Path(tmp))


def with_database(args: argparse.Namespace, workdir: Path) -> int:
    if args.dsn:
        return run(args, args.dsn, workdir)
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    with ThrowawayPostgres() as pg:
        return run(args, pg.create_database("wsrm_xa_example"), workdir)


if __name__ == "__main__":
    sys.exit(main())

"""The two processes of ``wsrm demo``: a reliable spyne server and a reliable zeep client.

They run as separate processes so the demo can SIGKILL and restart either of
them mid-run::

    python -m wsrm_plugin.tools.demo_peer server --store URL --port N --records SPEC [--tm-log P --node N]
    python -m wsrm_plugin.tools.demo_peer client --wsdl FILE --store URL --messages N --records SPEC ...

Where each side keeps its *application* records decides what a crash can do
to them, so the demo spells it out (``--records``):

``store``
    a table in the WS-RM store's own SQL database, written through the
    delivery's store transaction: the record and the removal of the message
    from the store commit together (seed 004, 3.3.2: one transaction for the
    application's storage and the WS-RM storage).  The client's to-do list is
    then its outbox: message ``i`` is the store's message number ``i``, so a
    restarted client continues after the highest number the store handed out.
``file:PATH``
    a SQLite file of its own, committed on its own: for the memory store,
    which cannot survive a crash anyway.
``xa:DSN``
    PostgreSQL tables (APPLICATION_CLIENT, APPLICATION_SERVER, seed 004
    chapter 4) written through an ``XADataSource`` in the transaction
    manager's XA transaction: the client inserts its APPLICATION_CLIENT row
    and enqueues the message in one transaction; the server's invoker takes
    the message out of the store and inserts the APPLICATION_SERVER row in
    another.

Each process prints one line per event on stdout (``READY url``,
``ENQUEUED i``, ``CLOSED n``) for the demo to follow, and stops cleanly when
its stdin closes.
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys
import threading
import time
from typing import Any

from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.wire.namespaces import SOAP11

log = logging.getLogger(__name__)

TNS = "urn:wsrm-demo"
CLIENT_KEY = "demo"

#: Short retransmission intervals, so a lossy network costs the demo seconds, not minutes.
POLICY = RMPolicy(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05,
                  http_timeout=5.0, soap_version=SOAP11)

#: seconds between background recovery passes (XA mode): a branch the killed peer left prepared
#: holds its row locks until a pass rolls it back
RECOVERY_INTERVAL = 2.0
SERVER_TABLE = "application_server"
CLIENT_TABLE = "application_client"
REPLY_TABLE = "application_client_reply"

#: (table, DDL columns) of every application table; ``item`` names the demo message.
TABLES = {
    SERVER_TABLE: "item TEXT NOT NULL, sequence_id TEXT, message_number INTEGER",
    CLIENT_TABLE: "item TEXT PRIMARY KEY",
    REPLY_TABLE: "item TEXT NOT NULL, reply TEXT NOT NULL",
}


def item_name(number: int) -> str:
    """The demo's message ``number`` (1-based), as the client sends it and the server records it."""
    return f"m{number:05d}"


class Records:
    """Where one process keeps its application rows (see the module docstring for the kinds)."""

    def __init__(self, spec: str, *, store: Any = None, tm: Any = None) -> None:
        self.kind, _, where = spec.partition(":")
        self._lock = threading.Lock()
        self.postgres = self.kind == "xa"  # the rows are in a PostgreSQL database
        if self.kind == "store":
            from wsrm_plugin.store.postgres import PostgresStore
            from wsrm_plugin.store.sqlite import SqliteStore

            if not isinstance(store, (SqliteStore, PostgresStore)):
                raise ValueError("--records store needs a SQL store (sqlite or postgresql), "
                                 f"not {store!r}")
            self.store = store
            self.postgres = isinstance(store, PostgresStore)
        elif self.kind == "file":
            if not where:
                raise ValueError("--records file:PATH needs a path")
            self.path = where
        elif self.kind == "xa":
            from txmanager.postgres import XADataSource

            if tm is None or not where:
                raise ValueError("--records xa:DSN needs a DSN and a transaction manager (--tm-log)")
            self.dsn = where
            self.ds = XADataSource(where, tm)
        else:
            raise ValueError(f"unknown --records {spec!r}: use store, file:PATH or xa:DSN")

    def create_tables(self, *tables: str) -> None:
        # PostgreSQL places a row wherever a page has room (a rolled-back insert's space is used
        # again), so its physical order is not the order of the inserts: a serial column keeps
        # that order (SQLite's rowid does); it comes last, so the positional inserts fill the rest
        serial = ", seen BIGSERIAL" if self.postgres else ""
        for table in tables:
            ddl = f"CREATE TABLE IF NOT EXISTS {table} ({TABLES[table]}{serial})"
            if self.kind == "store":
                with self.store.begin() as tx:
                    tx.write(ddl)
            elif self.kind == "file":
                with self._file() as conn:
                    conn.execute(ddl)
            else:
                import psycopg2

                conn = psycopg2.connect(self.dsn)
                try:
                    with conn, conn.cursor() as cur:
                        cur.execute(ddl)
                finally:
                    conn.close()

    def _file(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def insert(self, table: str, values: tuple[Any, ...], delivery: Any = None) -> None:
        """Insert one row: in ``delivery``'s store transaction, the XA transaction, or on its own."""
        marks = ", ".join("?" for _ in values)
        if self.kind == "store":
            if delivery is None:
                raise RuntimeError("a store record needs the delivery's transaction (no WS-RM delivery?)")
            delivery.transaction.write(f"INSERT INTO {table} VALUES ({marks})", values)
        elif self.kind == "file":
            with self._lock, self._file() as conn:
                conn.execute(f"INSERT INTO {table} VALUES ({marks})", values)
        else:
            with self.ds.connection() as conn, conn.cursor() as cur:
                cur.execute(f"INSERT INTO {table} VALUES ({marks.replace('?', '%s')})", values)

    def count(self, table: str) -> int:
        """Rows of ``table`` (the XA client's progress: rows committed with their messages)."""
        import psycopg2

        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT count(*) FROM {table}")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def close(self) -> None:
        if self.kind == "xa":
            self.ds.close()


#: The records of this process (set by main); the service methods and the reply callback write there.
_records: Records | None = None


def _record_delivery(ctx: Any, item: str) -> None:
    from interceptors.spyne_server.service import delivery_context

    delivery = delivery_context(ctx)
    assert _records is not None, "the demo server's records are not configured"
    _records.insert(SERVER_TABLE, (item, getattr(delivery, "sequence_id", None),
                                   getattr(delivery, "message_number", None)), delivery)


class DemoService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def record(ctx, item):  # noqa: N805 -- spyne's signature
        """One-way: the server's application stores the item."""
        _record_delivery(ctx, item)

    @rpc(Unicode, _returns=Unicode)
    def echo(ctx, item):  # noqa: N805
        """In-out: store the item and answer it."""
        _record_delivery(ctx, item)
        return "re:" + item


def application() -> Application:
    return Application([DemoService], tns=TNS, name="DemoService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


def on_reply(reply: Any) -> None:
    """The client's persisted reply callback: record the reply in the delivery's transaction."""
    assert _records is not None, "the demo client's records are not configured"
    if reply.fault is not None:
        raise RuntimeError(f"the demo service answered {reply.user_context} with a fault: {reply.fault}")
    _records.insert(REPLY_TABLE, (reply.user_context, str(reply.result)), reply.context)


def _transaction_manager(args: argparse.Namespace) -> Any:
    if not args.tm_log:
        return None
    from txmanager import TransactionManager

    # safety_interval=0: the only other process that used this node name is dead (killed by the demo)
    return TransactionManager(node=args.node, log=args.tm_log, safety_interval=0)


def run_server(args: argparse.Namespace) -> None:
    global _records
    from interceptors.spyne_server.service import reliable_service

    tm = _transaction_manager(args)
    service = reliable_service(application(), args.store, POLICY, tm=tm,
                               recovery_interval=RECOVERY_INTERVAL if tm is not None else None)
    _records = Records(args.records, store=service.engine.store, tm=tm)
    _records.create_tables(SERVER_TABLE)
    http = service.serve("127.0.0.1", args.port)
    service.start()
    print(f"READY {http.url}", flush=True)
    try:
        sys.stdin.read()  # the demo closes our stdin to stop us
    finally:
        service.stop(timeout=5)
        _records.close()
        if tm is not None:
            tm.close()


def _enqueued_so_far(rc: Any, records: Records) -> int:
    """How many messages an earlier run of this client already enqueued (see the module docstring)."""
    if records.kind == "xa":
        return records.count(CLIENT_TABLE)
    with rc.engine.store.begin() as tx:
        return sum(seq.highest_number for seq in tx.rms.list_all())


def run_client(args: argparse.Namespace) -> None:
    global _records
    import zeep

    from interceptors.zeep_client.client import reliable_client

    tm = _transaction_manager(args)
    listen = ("127.0.0.1", args.listen_port) if args.listen_port else None
    rc = reliable_client(zeep.Client(args.wsdl), args.store, POLICY, tm=tm, listen=listen,
                         endpoint_address=args.reply_address, key=CLIENT_KEY, name="demo-client",
                         recovery_interval=RECOVERY_INTERVAL if tm is not None else None)
    _records = Records(args.records, store=rc.engine.store, tm=tm)
    _records.create_tables(*((CLIENT_TABLE,) if _records.kind == "xa" else ()),
                           *((REPLY_TABLE,) if args.in_out else ()))
    try:
        done = _enqueued_so_far(rc, _records)
        print(f"RESUMED {done}", flush=True)
        for number in range(done + 1, args.messages + 1):
            item = item_name(number)
            if tm is not None:
                with tm.transaction():
                    _records.insert(CLIENT_TABLE, (item,))
                    _call(rc, item, args.in_out)
            else:
                _call(rc, item, args.in_out)
            print(f"ENQUEUED {number}", flush=True)
            if args.pace:
                time.sleep(args.pace)
        print("ENQUEUED-ALL", flush=True)
        for line in sys.stdin:  # "close": end the sequences; end of input: stop
            if line.strip() == "close":
                rc.close()
                deadline = time.monotonic() + 30
                while rc.engine.store.status().rms and time.monotonic() < deadline:
                    time.sleep(0.05)
                print(f"CLOSED {len(rc.engine.store.status().rms)}", flush=True)
    finally:
        rc.stop(timeout=5)
        _records.close()
        if tm is not None:
            tm.close()


def _call(rc: Any, item: str, in_out: bool) -> None:
    if in_out:
        rc.service.echo(item, _callback="wsrm_plugin.tools.demo_peer:on_reply", _context=item)
    else:
        rc.service.record(item)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m wsrm_plugin.tools.demo_peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("server", "client"):
        p = sub.add_parser(role)
        p.add_argument("--store", required=True, help="the WS-RM store URL")
        p.add_argument("--records", required=True, help="store | file:PATH | xa:DSN")
        p.add_argument("--tm-log", help="the transaction manager's log (XA mode)")
        p.add_argument("--node", default=f"demo-{role}", help="the transaction manager's node name")
        if role == "server":
            p.add_argument("--port", type=int, required=True)
        else:
            p.add_argument("--wsdl", required=True, help="the service's WSDL (file or URL)")
            p.add_argument("--messages", type=int, required=True)
            p.add_argument("--in-out", action="store_true")
            p.add_argument("--listen-port", type=int, help="serve the reply endpoint here (in-out)")
            p.add_argument("--reply-address", help="the public URL of the reply endpoint")
            p.add_argument("--pace", type=float, default=0.0, help="seconds between two messages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    (run_server if args.role == "server" else run_client)(args)


if __name__ == "__main__":
    # Run as the importable module, not as __main__: the reply callback is found by its import path
    # ("wsrm_plugin.tools.demo_peer:on_reply") and must see the records this process configured.
    from wsrm_plugin.tools.demo_peer import main as _main

    _main()

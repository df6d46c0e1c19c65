"""A WS-RM peer in its own process, for tests that need two processes (kill -9, soak, XA).

Server: serve an engine and record every delivery::

    python -m tests.engine.peer --role server --store sqlite:///srv.db --port 0 --log delivered.db

prints ``READY <url>`` once it serves, and stops cleanly on SIGTERM/SIGINT.
Each hand-over to the application is a row in the SQLite ``--log`` file
(duplicates included, so a checker sees them).  With ``--record-dsn`` the
row goes to a PostgreSQL table ``delivered`` instead, in the same XA
transaction as the removal from the invoker buffer (``--tm-log`` is the
transaction manager's recovery log, ``--node`` its name): exactly once even
across kill -9, which a separate SQLite log cannot promise.  With
``--record-in-store`` (SQL stores) the row goes to an ``app_delivered`` table
in the store's own database, in the delivery's local store transaction: what
an application whose tables share the store's database gets, and exactly once
across kill -9 without XA.

Client: send ``--count`` messages (``<prefix><i>`` for i from ``--start``),
optionally ``--close`` the sequence, and wait until the RMS store is empty::

    python -m tests.engine.peer --role client --store sqlite:///cli.db --target URL --count 100 --close

prints one JSON line with the final status and exits 0 when drained, 1 when
``--drain-timeout`` passed first.  ``--count 0`` just finishes what an earlier
(killed) client left in its store.  With ``--record-dsn`` each send is one XA
transaction with an insert into the ``sent`` table.  It prints ``STARTED`` once
its engine runs (a kill test times its kills from there).

``--resume`` makes a client restarted after kill -9 with the same arguments
send only what the killed one had not handed over yet, so every message is
enqueued exactly once: with ``--record-dsn`` the ``sent`` rows (committed with
the enqueue, both or neither) say how many were; without, the open source
sequence in the store does (message ``i`` is its number ``i + 1``), and the
file ``--progress`` records, durably and before the Close, that all were.
``--die-at-checkpoint P`` SIGKILLs the process at each transaction-manager
checkpoint (between prepare, decision and commit) with probability ``P``:
the crash windows of two-phase commit that kills from outside rarely hit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from wsrm_plugin.engine import ReliableEngine, RMPolicy

from .support import ACTION, DeliveryLog, item_text, payload

log = logging.getLogger("tests.engine.peer")


def _policy(args: argparse.Namespace) -> RMPolicy:
    limits: dict[str, Any] = {}
    if getattr(args, "max_message_size", None):
        limits["max_message_size"] = args.max_message_size
    if getattr(args, "held_bytes", None):
        limits.update(max_held_bytes=args.held_bytes, max_held_bytes_per_peer=args.held_bytes,
                      max_held_bytes_per_sequence=args.held_bytes)
    if getattr(args, "deliver_apart", False):
        limits["deliver_apart"] = True
    if getattr(args, "deliver_auto", False):
        limits["deliver_apart"] = None
    if getattr(args, "no_first_when_busy", False):
        limits["first_when_busy"] = False
    if getattr(args, "receive_together", None):
        limits["receive_together"] = args.receive_together
    return RMPolicy(rm_version=args.rm, base_retransmission_interval=args.base_interval,
                    exponential_backoff=False, max_retries=args.max_retries, poll_interval=0.05,
                    http_timeout=5.0, **limits)


def _transaction_manager(args: argparse.Namespace, store: Any) -> tuple[Any, Any]:
    """(tm, XADataSource) when --record-dsn is given, else (None, None)."""
    if not args.record_dsn:
        return None, None
    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource

    tm = TransactionManager(node=args.node, log=args.tm_log, safety_interval=args.safety_interval,
                            checkpoint=_checkpoint_killer(args.die_at_checkpoint))
    tm.register_resource(store.xa_resource())
    ds = XADataSource(args.record_dsn, tm)
    with ds.connection() as conn, conn.cursor() as cur:  # local: schema set-up
        # xact: the application branch's transaction, shared by the rows one global transaction
        # delivered together (RMPolicy.receive_together)
        cur.execute("CREATE TABLE IF NOT EXISTS delivered (id BIGSERIAL PRIMARY KEY, sequence_id TEXT, "
                    "number BIGINT, message_id TEXT, item TEXT, at DOUBLE PRECISION, "
                    "xact BIGINT DEFAULT txid_current())")
        cur.execute("CREATE TABLE IF NOT EXISTS sent (id BIGSERIAL PRIMARY KEY, item TEXT)")
    report = tm.recovery.recover_once()
    log.info("recovery at start: %s", report.summary())
    return tm, ds


def _checkpoint_killer(probability: float) -> Any:
    """The TM crash hook: SIGKILL this process at a checkpoint with ``probability``.

    Seeded afresh at each start: a restarted peer that drew the same numbers
    would die at the same checkpoint again, every time.
    """
    if not probability:
        return None
    rng = random.Random()

    def checkpoint(point: str, index: int) -> None:
        if rng.random() < probability:
            log.warning("dying at transaction checkpoint %s:%d", point, index)
            os.kill(os.getpid(), signal.SIGKILL)

    return checkpoint


#: The application's own table in the store's database (``--record-in-store``).
_APP_TABLE = {
    "sqlite": "CREATE TABLE IF NOT EXISTS app_delivered (id INTEGER PRIMARY KEY AUTOINCREMENT, "
              "sequence_id TEXT, number INTEGER, message_id TEXT, item TEXT, at REAL)",
    "postgresql": "CREATE TABLE IF NOT EXISTS app_delivered (id BIGSERIAL PRIMARY KEY, sequence_id TEXT, "
                  "number BIGINT, message_id TEXT, item TEXT, at DOUBLE PRECISION)",
}


def _create_app_table(store: Any) -> None:
    with store.begin() as tx:
        dialect = getattr(getattr(tx, "d", None), "name", None)
        if dialect not in _APP_TABLE:
            raise SystemExit(f"--record-in-store needs an SQL store (sqlite or postgresql), not {store!r}")
        tx.execute(_APP_TABLE[dialect])


def run_server(args: argparse.Namespace) -> int:
    from wsrm_plugin.store import open_store

    store = open_store(args.store)
    tm, ds = _transaction_manager(args, store)
    record_log = DeliveryLog(args.log) if args.log else None
    if args.record_in_store:
        _create_app_table(store)

    def application(envelope: bytes, context: Any) -> None:
        item = item_text(envelope)
        if args.record_in_store:  # the delivery's own store transaction: commits with the dequeue
            context.transaction.execute(
                "INSERT INTO app_delivered (sequence_id, number, message_id, item, at) VALUES (?, ?, ?, ?, ?)",
                (context.sequence_id, context.message_number, context.message_id, item, time.time()))
        if ds is not None:
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO delivered (sequence_id, number, message_id, item, at) "
                            "VALUES (%s, %s, %s, %s, %s)",
                            (context.sequence_id, context.message_number, context.message_id, item, time.time()))
        if record_log is not None:
            record_log.record(context.sequence_id, context.message_number, context.message_id, item)

    engine = ReliableEngine(store, _policy(args), tm=tm, application=application, name="peer-server")
    server = engine.serve(args.host, args.port)
    engine.start()
    print(f"READY {server.url}", flush=True)
    _wait_for_signal()
    engine.stop(timeout=5)
    store.close()
    if record_log is not None:
        record_log.close()
    if tm is not None:
        tm.close()
    return 0


def keys_of(args: argparse.Namespace) -> list[str]:
    """The sequence keys of a client: ``--key`` itself, or ``--keys N`` of them (``<key>0`` ...)."""
    return [args.key] if args.keys <= 1 else [f"{args.key}{k}" for k in range(args.keys)]


def items_of(args: argparse.Namespace, k: int) -> list[str]:
    """The items of the ``k``-th key, in their order: with N keys, every N-th item of the run."""
    every = len(keys_of(args))
    return [f"{args.prefix}{i}" for i in range(args.start, args.start + args.count) if (i - args.start) % every == k]


def _handed_over(args: argparse.Namespace, store: Any, ds: Any, k: int = 0) -> int:
    """How many of this run's messages of the ``k``-th key an earlier (killed) client enqueued."""
    mine = items_of(args, k)
    if ds is not None:  # the sent rows committed with their enqueue
        with ds.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT item FROM sent")
            sent = [row[0] for row in cur.fetchall() if row[0] in set(mine)]
        if set(sent) != set(mine[:len(sent)]) or len(sent) != len(set(sent)):
            raise SystemExit(f"the sent table is not a prefix of this key's items: {sorted(sent)[:20]}")
        return len(sent)
    if _progress_done(args.progress, args.count):
        return len(mine)
    from wsrm_plugin.engine.source import SequenceKey
    from wsrm_plugin.store.api.states import rms_life

    key = keys_of(args)[k]
    with store.begin() as tx:
        for seq in tx.rms.list_all():
            parsed = SequenceKey.decode(seq.key)
            if parsed and (parsed.target, parsed.key) == (args.target, key) and rms_life(seq).accepts_messages:
                return seq.highest_number
    return 0


def _progress_done(path: str | None, count: int) -> bool:
    try:
        with open(path or "", encoding="utf-8") as f:
            return f.read().strip() == f"enqueued {count}"
    except FileNotFoundError:
        return False


def _write_progress(path: str, count: int) -> None:
    """Durably note that all ``count`` messages are enqueued (before the Close ends the sequence)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"enqueued {count}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_client(args: argparse.Namespace) -> int:
    from wsrm_plugin.store import open_store

    store = open_store(args.store)
    tm, ds = _transaction_manager(args, store)
    engine = ReliableEngine(store, _policy(args), tm=tm, name="peer-client").start()
    print("STARTED", flush=True)
    keys = keys_of(args)
    failed: list[BaseException] = []

    def send_all(k: int) -> None:  # one key's items, in order (a thread each with --keys)
        key = keys[k]
        try:
            mine = items_of(args, k)
            done = _handed_over(args, store, ds, k) if args.resume else 0
            if done:
                log.info("resuming key %r: %d of %d messages were enqueued before", key, done, len(mine))
            for item in mine[done:]:
                if tm is None:
                    engine.send(args.target, payload(item), action=ACTION, key=key)
                    continue
                with tm.transaction():
                    with ds.connection() as conn, conn.cursor() as cur:
                        cur.execute("INSERT INTO sent (item) VALUES (%s)", (item,))
                    engine.send(args.target, payload(item), action=ACTION, key=key)
        except BaseException as exc:  # noqa: BLE001 -- raised in the main thread
            failed.append(exc)

    try:
        threads = [threading.Thread(target=send_all, args=(k,)) for k in range(len(keys))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise failed[0]
        if args.progress and not _progress_done(args.progress, args.count):
            _write_progress(args.progress, args.count)
        if args.close:
            for key in keys:
                engine.close(args.target, key)
        drained = engine.wait_until(lambda s: s.rms_sequences == 0 if args.close else s.unacked == 0,
                                    args.drain_timeout)
        status = engine.status()
        print(json.dumps({"drained": drained, "unacked": status.unacked, "rms_sequences": status.rms_sequences,
                          "messages_sent": status.messages_sent, "retransmissions": status.retransmissions,
                          "faulted_sequences": status.faulted_sequences}), flush=True)
        return 0 if drained else 1
    finally:
        engine.stop(timeout=5)
        store.close()
        if tm is not None:
            tm.close()


class PeerProcess:
    """A peer started as ``python -m tests.engine.peer ARGS`` by a test, restartable after kill -9.

    Its output is read by threads so the pipes never fill; ``restart()``
    starts the same command again (same store, same port), which is what a
    supervisor does after a crash.
    """

    def __init__(self, *args: str, cwd: str | os.PathLike[str] | None = None) -> None:
        self.args = [str(a) for a in args]
        self.cwd = cwd or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.starts = 0
        self.proc: Any = None
        self.start()

    def start(self) -> PeerProcess:
        import collections
        import subprocess

        self.proc = subprocess.Popen([sys.executable, "-m", "tests.engine.peer", *self.args], cwd=self.cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.errors: collections.deque[str] = collections.deque(maxlen=200)
        self.starts += 1
        self._pumps = [threading.Thread(target=self._pump, args=(stream, into), daemon=True)
                       for stream, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.errors))]
        for pump in self._pumps:
            pump.start()
        return self

    @staticmethod
    def _pump(stream: Any, into: Any) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_line(self, prefix: str, timeout: float = 60.0) -> str | None:
        """The first output line starting with ``prefix``; None if the process ended or time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None:
                time.sleep(0.1)  # let the pump threads catch up with the last lines
                return next((l for l in self.lines if l.startswith(prefix)), None)
            time.sleep(0.02)
        return None

    def ready_url(self, timeout: float = 60.0) -> str:
        line = self.wait_line("READY ", timeout)
        if line is None:
            raise RuntimeError(f"peer {self.args} did not start (exit {self.proc.poll()}): {self.tail()}")
        return line.split(" ", 1)[1]

    def status(self) -> dict[str, Any] | None:
        """A client's final JSON status line, if it printed one.  Once the process ended, its
        output is read to the end first (the pump threads may still be behind its exit)."""
        if self.proc.poll() is not None:
            for pump in self._pumps:
                pump.join(30)
        for line in reversed(self.lines):
            if line.startswith("{"):
                return json.loads(line)
        return None

    def tail(self, lines: int = 20) -> str:
        return "\n".join(list(self.errors)[-lines:])

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, like a power cut of the application."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)

    def restart(self) -> PeerProcess:
        self.kill()
        return self.start()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.engine.peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", choices=("server", "client"), required=True)
    p.add_argument("--store", required=True, help="store URL (memory:, sqlite:///path, postgresql://...)")
    p.add_argument("--rm", default="1.1", choices=("1.0", "1.1"))
    p.add_argument("--base-interval", type=float, default=0.2, help="retransmission interval, seconds")
    p.add_argument("--max-retries", type=int, default=None)
    p.add_argument("--record-dsn", help="PostgreSQL DSN: record in XA transactions (needs --tm-log)")
    p.add_argument("--tm-log", help="the transaction manager's recovery log file")
    p.add_argument("--node", default="peer", help="transaction manager node name (unique per process role)")
    p.add_argument("--safety-interval", type=float, default=5.0)
    p.add_argument("--die-at-checkpoint", type=float, default=0.0, metavar="P",
                   help="SIGKILL self at each transaction checkpoint with probability P (crash tests)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=0)
    server.add_argument("--log", help="SQLite file recording each delivery")
    server.add_argument("--held-bytes", type=int, help="the destination's byte budgets (all three)")
    server.add_argument("--max-message-size", type=int)
    server.add_argument("--deliver-apart", action="store_true",
                        help="RMPolicy.deliver_apart: on SQLite, run the application outside the store's transactions")
    server.add_argument("--deliver-auto", action="store_true",
                        help="RMPolicy.deliver_apart=None: on SQLite, apart while another sequence's receive is under way")
    server.add_argument("--no-first-when-busy", action="store_true",
                        help="RMPolicy.first_when_busy off: on SQLite delivering inside, a receive that finds a "
                        "batch holding the file waits for it (instead of running its application first)")
    server.add_argument("--receive-together", type=int, metavar="N",
                        help="RMPolicy.receive_together: receives under way at once delivered in one transaction")
    server.add_argument("--record-in-store", action="store_true",
                        help="record each delivery in the store's database, in the delivery's transaction")
    client = p.add_argument_group("client")
    client.add_argument("--target")
    client.add_argument("--count", type=int, default=0)
    client.add_argument("--start", type=int, default=0)
    client.add_argument("--prefix", default="m")
    client.add_argument("--key", default="")
    client.add_argument("--keys", type=int, default=1,
                        help="send on this many sequences at once, a thread each (keys <key>0 ...): "
                             "item i goes on key i mod N, each key's items in order")
    client.add_argument("--close", action="store_true")
    client.add_argument("--drain-timeout", type=float, default=60.0)
    client.add_argument("--resume", action="store_true",
                        help="enqueue only what an earlier run with the same arguments did not")
    client.add_argument("--progress", help="file noting durably that every message was enqueued "
                        "(needed by --resume without --record-dsn)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s")
    if args.record_dsn and not args.tm_log:
        raise SystemExit("--record-dsn needs --tm-log (the commit decisions must survive a crash)")
    if args.resume and not args.record_dsn and not args.progress:
        raise SystemExit("--resume without --record-dsn needs --progress FILE (it records that every "
                         "message was enqueued, which the store forgets once the sequence ends)")
    if args.role == "server":
        return run_server(args)
    if not args.target:
        raise SystemExit("--role client needs --target")
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())

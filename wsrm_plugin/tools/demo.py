"""The WS-RM demo: a zeep client sends messages to a spyne service over a lossy network.

It is what ``wsrm demo`` (and ``scripts/demo.sh``) runs.  The server and the
client are two processes (:mod:`wsrm_plugin.tools.demo_peer`): the server is a
spyne service made reliable with ``reliable_service``, the client a zeep
client made reliable with ``reliable_client``, each with its own message
store.  Between them the built-in ``LossyProxy`` drops requests and
responses.  Every message the client enqueues must reach the service's
application exactly once, whatever is lost on the way (and, with
``--crash``, whichever process is killed).

The demo does not trust counters: at the end it reads the server's
application table (and, with ``--in-out``, the client's reply table) and
compares them with what the client was told to send.  The last line says
how many messages were delivered, lost and duplicated; the exit status is
0 only when every message arrived exactly once.

Variants:

``--store memory|sqlite|postgresql``
    where both WS-RM stores live (default: SQLite files in a temporary
    folder).  With a SQL store, the server's application table is in the
    store's database, written in the same transaction that takes the
    message out of the store.
``--xa``
    seed 004 chapter 4: the stores and the application tables
    APPLICATION_CLIENT and APPLICATION_SERVER are PostgreSQL databases; the
    client inserts its row and enqueues its message in one XA transaction,
    the server takes the message and inserts its row in another.  A
    throwaway PostgreSQL server is started unless ``--dsn`` names one.
``--in-out``
    request-response: the service answers each message; the replies come
    back reliably (on the sequence the client offered) through a second
    lossy proxy, and must each arrive once too.
``--crash``
    SIGKILL the client while it is enqueueing and the server while it is
    delivering, and restart both: nothing may be lost or duplicated.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from wsrm_plugin.engine.transport import free_port as transport_free_port
from wsrm_plugin.tools.demo_peer import REPLY_TABLE, SERVER_TABLE, item_name
from wsrm_plugin.tools.proxy import LossyProxy

log = logging.getLogger(__name__)

STORES = ("sqlite", "memory", "postgresql")


class DemoError(RuntimeError):
    """The demo could not run (a process did not start, PostgreSQL is missing...)."""


# -- what arrived, read from the application tables -----------------------------------------------

@dataclass(frozen=True)
class Rows:
    """Where one side's application rows are: a SQLite file or a PostgreSQL database."""

    kind: str  # "sqlite" | "postgresql"
    target: str  # path or DSN

    def items(self, table: str) -> list[str]:
        """The ``item`` column of ``table`` in insertion order ([] while the table does not exist).

        Not PostgreSQL's ``ctid``: that is where a row is, and an insert takes the room a
        rolled-back one left (a delivery the server was killed in), so after a crash the
        order read by ``ctid`` was wrong now and then (the demo said "out of order" when
        the application had seen every message in order)."""
        order = "rowid" if self.kind == "sqlite" else "seen"
        query = f"SELECT item FROM {table} ORDER BY {order}"
        if self.kind == "sqlite":
            import sqlite3

            if not os.path.exists(self.target):
                return []
            conn = sqlite3.connect(f"file:{self.target}?mode=ro", uri=True, timeout=30)
            try:
                return [row[0] for row in conn.execute(query)]
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise
            finally:
                conn.close()
        import psycopg2

        conn = psycopg2.connect(self.target)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)", (table,))
                if cur.fetchone()[0] is None:
                    return []
                cur.execute(query)
                return [row[0] for row in cur.fetchall()]
        finally:
            conn.close()


@dataclass(frozen=True)
class Verdict:
    """What arrived compared with what was sent: the demo's result."""

    expected: int
    delivered: int  # messages that arrived exactly once (and, in-out, whose reply did)
    lost: int  # messages that never arrived (or whose reply never did)
    duplicated: int  # messages that arrived more than once (or whose reply did)
    unexpected: int  # rows that name no message the client sent
    in_order: bool

    @property
    def ok(self) -> bool:
        return self.delivered == self.expected and not (self.lost or self.duplicated or self.unexpected)

    def line(self) -> str:
        extra = f", {self.unexpected} unexpected" if self.unexpected else ""
        return (f"{'OK' if self.ok else 'FAILED'}: {self.delivered} delivered, {self.lost} lost, "
                f"{self.duplicated} duplicated{extra} (of {self.expected} messages)")


def verify(expected: Sequence[str], received: Sequence[str], replies: Sequence[str] | None = None) -> Verdict:
    """Count each expected item in ``received`` (and ``replies``): once is delivered, 0 lost, 2+ duplicated."""
    seen = collections.Counter(received)
    answered = collections.Counter(replies) if replies is not None else None
    delivered = lost = duplicated = 0
    for item in expected:
        counts = [seen[item]] + ([answered[item]] if answered is not None else [])
        if any(c == 0 for c in counts):
            lost += 1
        elif any(c > 1 for c in counts):
            duplicated += 1
        else:
            delivered += 1
    wanted = set(expected)
    unexpected = sum(n for item, n in seen.items() if item not in wanted)
    if answered is not None:
        unexpected += sum(n for item, n in answered.items() if item not in wanted)
    firsts = list(dict.fromkeys(item for item in received if item in wanted))
    in_order = firsts == [item for item in expected if item in seen]
    return Verdict(len(expected), delivered, lost, duplicated, unexpected, in_order)


# -- the two processes ----------------------------------------------------------------------------

def free_port() -> int:
    """A port for a peer process to serve on (see :func:`wsrm_plugin.engine.transport.free_port`)."""
    return transport_free_port()


class Peer:
    """One ``demo_peer`` process: started, followed line by line, killed or stopped."""

    def __init__(self, role: str, options: dict[str, Any], log_path: str) -> None:
        self.role = role
        self.command = [sys.executable, "-m", "wsrm_plugin.tools.demo_peer", role]
        for name, value in options.items():
            if value is True:
                self.command.append(f"--{name.replace('_', '-')}")
            elif value not in (None, False):
                self.command += [f"--{name.replace('_', '-')}", str(value)]
        self.log_path = log_path
        self.enqueued = 0
        self._events: queue.Queue[str | None] = queue.Queue()
        self.child: subprocess.Popen[str] | None = None

    def start(self) -> Peer:
        with open(self.log_path, "a", encoding="utf-8") as stderr:
            self.child = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=stderr, text=True, bufsize=1)
        threading.Thread(target=self._follow, args=(self.child,), name=f"demo-{self.role}-stdout",
                         daemon=True).start()
        return self

    def _follow(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "ENQUEUED":
                self.enqueued = max(self.enqueued, int(rest))
            else:
                self._events.put(line.strip())
        self._events.put(None)

    @property
    def process(self) -> subprocess.Popen[str]:
        """The running child; asking before it was started is the demo's own bug."""
        if self.child is None:
            raise DemoError(f"the {self.role} was never started")
        return self.child

    def expect(self, word: str, timeout: float) -> str:
        """Wait for the next line starting with ``word``; returns the rest of it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise DemoError(f"the {self.role} did not say {word} within {timeout:.0f} s; "
                                f"its log:\n{self.log_tail()}") from None
            if line is None:
                raise DemoError(f"the {self.role} exited ({self.process.wait()}) before saying {word}; "
                                f"its log:\n{self.log_tail()}")
            if line.split(" ")[0] == word:
                return line[len(word):].strip()

    def tell(self, line: str) -> None:
        assert self.child is not None and self.child.stdin is not None
        with contextlib.suppress(OSError):
            self.child.stdin.write(line + "\n")
            self.child.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush; the process's stores and logs stay as they were."""
        assert self.child is not None
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=30)
        self._close_pipes()

    def stop(self, timeout: float = 30.0) -> int | None:
        """Close stdin (the peer's signal to stop cleanly); kill it if it does not."""
        if self.child is None:
            return None
        if self.child.poll() is None:
            with contextlib.suppress(OSError):
                if self.child.stdin is not None:
                    self.child.stdin.close()
            try:
                self.child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("the %s did not stop within %.0f s: killing it", self.role, timeout)
                self.child.kill()
                self.child.wait(timeout=30)
        self._close_pipes()
        return self.child.returncode

    def _close_pipes(self) -> None:
        if self.child is None:
            return
        for pipe in (self.child.stdin, self.child.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:]) or "(empty)"
        except OSError:
            return "(no log)"


# -- the progress bar ------------------------------------------------------------------------------

class Progress:
    """A plain-text progress bar on stderr; story lines go to ``out`` above it."""

    WIDTH = 30

    def __init__(self, total: int, out: IO[str], err: IO[str]) -> None:
        self.total = max(total, 1)
        self.out = out
        self.err = err
        self.tty = err.isatty()
        self._shown = ""
        self._last_step = -1

    def update(self, done: int, note: str = "") -> None:
        filled = min(self.WIDTH, self.WIDTH * done // self.total)
        text = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total} {note}".rstrip()
        if self.tty:
            self.err.write("\r" + text.ljust(len(self._shown)))
            self.err.flush()
            self._shown = text
        else:  # a log file: one line per tenth, not a flood of carriage returns
            step = 10 * done // self.total
            if step != self._last_step:
                self._last_step = step
                self.err.write(text + "\n")
                self.err.flush()

    def say(self, text: str) -> None:
        self.clear()
        self.out.write(text + "\n")
        self.out.flush()

    def clear(self) -> None:
        if self.tty and self._shown:
            self.err.write("\r" + " " * len(self._shown) + "\r")
            self.err.flush()
            self._shown = ""


# -- PostgreSQL, when the variant needs it ---------------------------------------------------------

@contextlib.contextmanager
def _databases(names: list[str], dsn: str | None) -> Iterator[dict[str, str]]:
    """Fresh databases ``names`` on a throwaway server, or on the server ``dsn`` names."""
    if not names:
        yield {}
        return
    if dsn is None:
        from wsrm_plugin.tools.pgserver import ThrowawayPostgres

        with ThrowawayPostgres() as pg:
            for name in names:
                pg.create_database(name)
            yield {name: pg.dsn(name) for name in names}
        return
    import psycopg2
    from psycopg2.extensions import make_dsn, parse_dsn

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for name in names:
                cur.execute(f"DROP DATABASE IF EXISTS {name}")
                cur.execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    base = parse_dsn(dsn)
    yield {name: make_dsn(**{**base, "dbname": name}) for name in names}


# -- the run ---------------------------------------------------------------------------------------

@dataclass
class Plan:
    """The options, checked: what runs where."""

    messages: int
    loss: float
    store: str
    xa: bool
    in_out: bool
    crash: bool
    dsn: str | None
    seed: int | None
    timeout: float

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        store = args.store or ("postgresql" if args.xa else "sqlite")
        if args.messages < 1:
            raise ValueError("--messages must be at least 1")
        if not 0.0 <= args.loss <= 1.0:
            raise ValueError(f"--loss is a probability between 0 and 1, not {args.loss}")
        if args.xa and store != "postgresql":
            raise ValueError(f"--xa keeps the stores in PostgreSQL with the application tables; "
                             f"drop --store {store} (or use --store postgresql)")
        if args.crash and store == "memory":
            raise ValueError("--crash needs a durable store: a killed process loses a memory store; "
                             "use --store sqlite or postgresql")
        if args.dsn and store != "postgresql":
            raise ValueError("--dsn is for --store postgresql or --xa")
        return cls(args.messages, args.loss, store, args.xa, args.in_out, args.crash, args.dsn,
                   args.seed, args.timeout)

    def describe(self) -> str:
        mode = "in-out" if self.in_out else "one-way"
        xa = ", XA transactions (APPLICATION_CLIENT -> APPLICATION_SERVER)" if self.xa else ""
        crash = ", client and server SIGKILLed and restarted" if self.crash else ""
        return (f"{self.messages} {mode} messages, {self.store} stores{xa}, "
                f"{self.loss:.0%} of requests lost{crash}")


class Demo:
    """One run: the processes, the proxies, the crashes and the verdict."""

    def __init__(self, plan: Plan, tmp: str, dsns: dict[str, str], out: IO[str], err: IO[str]) -> None:
        self.plan = plan
        self.tmp = tmp
        self.out = out
        self.progress = Progress(plan.messages, out, err)
        self.expected = [item_name(n) for n in range(1, plan.messages + 1)]
        self.proxies: list[LossyProxy] = []
        self.peers: list[Peer] = []
        path = lambda name: os.path.join(tmp, name)  # noqa: E731

        if plan.store == "postgresql":
            stores = {side: "postgresql:" + dsns[f"wsrm_demo_{side}_store"] for side in ("client", "server")}
        elif plan.store == "sqlite":
            stores = {side: f"sqlite:///{path(side + '.db')}" for side in ("client", "server")}
        else:
            stores = {"client": "memory:", "server": "memory:"}
        self.stores = stores
        self.records: dict[str, str] = {}
        self.rows: dict[str, Rows] = {}
        for side in ("client", "server"):
            if plan.xa:
                dsn = dsns[f"wsrm_demo_application_{side}"]
                self.records[side], self.rows[side] = f"xa:{dsn}", Rows("postgresql", dsn)
            elif plan.store == "memory":
                file = path(f"application_{side}.db")
                self.records[side], self.rows[side] = f"file:{file}", Rows("sqlite", file)
            elif plan.store == "sqlite":
                self.records[side], self.rows[side] = "store", Rows("sqlite", path(side + ".db"))
            else:
                self.records[side] = "store"
                self.rows[side] = Rows("postgresql", dsns[f"wsrm_demo_{side}_store"])
        self.server_port = free_port()
        self.listen_port = free_port() if plan.in_out else None

    # -- processes ---------------------------------------------------------------------------

    def _server(self) -> Peer:
        peer = Peer("server", dict(store=self.stores["server"], port=self.server_port,
                                   records=self.records["server"],
                                   tm_log=os.path.join(self.tmp, "server-tm.log") if self.plan.xa else None,
                                   node="demo-server"),
                    os.path.join(self.tmp, "server.log")).start()
        self.peers.append(peer)
        peer.expect("READY", 120)
        return peer

    def _client(self, wsdl: str, reply_address: str | None) -> Peer:
        peer = Peer("client", dict(store=self.stores["client"], records=self.records["client"], wsdl=wsdl,
                                   messages=self.plan.messages, in_out=self.plan.in_out,
                                   listen_port=self.listen_port, reply_address=reply_address,
                                   pace=0.02 if self.plan.crash else 0.0,
                                   tm_log=os.path.join(self.tmp, "client-tm.log") if self.plan.xa else None,
                                   node="demo-client"),
                    os.path.join(self.tmp, "client.log")).start()
        self.peers.append(peer)
        return peer

    def _proxy(self, target: str) -> LossyProxy:
        seed = None if self.plan.seed is None else self.plan.seed + len(self.proxies)
        proxy = LossyProxy(target, drop=self.plan.loss, drop_response=self.plan.loss / 2, seed=seed).start()
        self.proxies.append(proxy)
        return proxy

    # -- the run ---------------------------------------------------------------------------------

    def arrived(self) -> tuple[list[str], list[str] | None]:
        received = self.rows["server"].items(SERVER_TABLE)
        replies = self.rows["client"].items(REPLY_TABLE) if self.plan.in_out else None
        return received, replies

    def _done(self, received: list[str], replies: list[str] | None) -> int:
        wanted = set(self.expected)
        done = len(wanted.intersection(received))
        if replies is not None:
            done = min(done, len(wanted.intersection(replies)))
        return done

    def run(self) -> Verdict:
        plan = self.plan
        self.progress.say(f"wsrm demo: {plan.describe()}")
        server = self._server()
        proxy = self._proxy(f"http://127.0.0.1:{self.server_port}/")
        wsdl = os.path.join(self.tmp, "service.wsdl")
        with urllib.request.urlopen(proxy.url + "?wsdl", timeout=30) as answer, open(wsdl, "wb") as f:
            f.write(answer.read())  # fetched through the proxy: the service address is the proxy's
        reply_address = None
        if plan.in_out:
            reply_address = self._proxy(f"http://127.0.0.1:{self.listen_port}/").url
        self.progress.say(f"server on port {self.server_port}, reached through a lossy proxy "
                          f"(seed {proxy.seed}); client store {self.stores['client'].split('?')[0]}")
        client = self._client(wsdl, reply_address)

        started = time.monotonic()
        deadline = started + plan.timeout
        crashes = ["client", "server"] if plan.crash else []
        done = 0
        while time.monotonic() < deadline:
            received, replies = self.arrived()
            done = self._done(received, replies)
            if done >= plan.messages:
                break
            if client.process.poll() is not None:
                raise DemoError(f"the client exited ({client.process.returncode}); its log:\n{client.log_tail()}")
            if crashes and crashes[0] == "client" and client.enqueued >= max(1, plan.messages // 3):
                at = client.enqueued
                client.kill()
                self.progress.say(f"killed the client (SIGKILL) after it enqueued {at} messages; restarting it")
                client = self._client(wsdl, reply_address)
                self.progress.say(f"the client resumed after message {client.expect('RESUMED', 120)}")
                crashes.pop(0)
            elif crashes and crashes[0] == "server" and len(set(received)) >= max(1, plan.messages // 2):
                server.kill()
                self.progress.say(f"killed the server (SIGKILL) after {len(received)} deliveries; "
                                  "restarting it on the same store")
                server = self._server()
                crashes.pop(0)
            self.progress.update(done, f"delivered  enqueued {client.enqueued}  "
                                       f"{time.monotonic() - started:.1f}s")
            time.sleep(0.1)
        self.progress.update(done, f"delivered  {time.monotonic() - started:.1f}s")
        self.progress.clear()
        if done < plan.messages:
            self.progress.say(f"timed out after {plan.timeout:.0f} s with {done} of {plan.messages} "
                              "messages through")
        else:
            self.progress.say(f"all {plan.messages} messages through in {time.monotonic() - started:.1f} s")
            client.tell("close")
            with contextlib.suppress(DemoError):
                left = client.expect("CLOSED", 60)
                self.progress.say("sequences closed and terminated" if left == "0"
                                  else f"{left} sequence(s) still open at the end")
        self.stop()
        for p in self.proxies:
            self.progress.say(f"proxy {p.url} -> {p.target}: {p.stats.dropped} requests and "
                              f"{p.stats.responses_dropped} responses dropped of {p.stats.received}")
        received, replies = self.arrived()
        verdict = verify(self.expected, received, replies)
        if not verdict.in_order:
            self.progress.say("note: the server's application saw the messages out of order")
        if not verdict.ok:
            for peer in self.peers[-2:]:
                self.progress.say(f"--- {peer.role} log (tail) ---\n{peer.log_tail()}")
        return verdict

    def stop(self) -> None:
        for peer in reversed(self.peers):
            peer.stop()
        for proxy in self.proxies:
            proxy.stop(flush=False)


def run(args: argparse.Namespace, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """Run the demo; 0 only when every message arrived exactly once (2: bad options)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        plan = Plan.from_args(args)
    except ValueError as exc:
        err.write(f"wsrm demo: {exc}\n")
        return 2
    names: list[str] = []
    if plan.store == "postgresql":
        names += ["wsrm_demo_client_store", "wsrm_demo_server_store"]
    if plan.xa:
        names += ["wsrm_demo_application_client", "wsrm_demo_application_server"]
    demo: Demo | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="wsrm-demo-") as tmp, _databases(names, plan.dsn) as dsns:
            demo = Demo(plan, tmp, dsns, out, err)
            try:
                verdict = demo.run()
            finally:
                demo.stop()
    except DemoError as exc:
        if demo is not None:
            demo.progress.clear()
        err.write(f"wsrm demo: {exc}\n")
        out.write(f"FAILED: the demo could not finish: {str(exc).splitlines()[0]}\n")
        return 1
    out.write(verdict.line() + "\n")
    out.flush()
    return 0 if verdict.ok else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--messages", type=int, default=100, help="messages to send (default 100)")
    p.add_argument("--loss", type=float, default=0.2,
                   help="probability that the proxy drops a request (default 0.2); half of it again "
                        "drops the response of a request that got through, so the server sees "
                        "retransmissions of messages it already has")
    p.add_argument("--store", choices=STORES, default=None,
                   help="where the WS-RM stores live (default sqlite; postgresql with --xa)")
    p.add_argument("--xa", action="store_true",
                   help="APPLICATION_CLIENT/APPLICATION_SERVER tables and the stores in PostgreSQL, "
                        "under the XA transaction manager")
    p.add_argument("--in-out", action="store_true", help="request-response calls; replies come back reliably")
    p.add_argument("--crash", action="store_true",
                   help="SIGKILL and restart the client and the server mid-run")
    p.add_argument("--dsn", help="an existing PostgreSQL server (default: start a throwaway one)")
    p.add_argument("--seed", type=int, help="the proxies' random seed (default: random, printed)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="give up (and report what is missing) after this many seconds (default 300)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wsrm demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

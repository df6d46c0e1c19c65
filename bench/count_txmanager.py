"""Client instructions and calls per one-database transaction (callgrind), by path.

Wall and CPU times on a shared machine wander; instruction counts do not.  Each
path runs ``n`` transactions against a throwaway PostgreSQL, once with 1,000 and
once with 3,000 under ``valgrind --tool=callgrind`` (client process only: the
server is another process); the difference over 2,000 is the cost of one
transaction, without start-up.  Paths:

* ``plain``: psycopg2 BEGIN/UPDATE/COMMIT (``conn.commit()``), the baseline;
* ``sql``: the statements as the manager sends them, by psycopg2 alone
  (``BEGIN;`` with the UPDATE in autocommit mode, then COMMIT by a cursor);
* ``lazy``: the same through :class:`txmanager.lazy_begin.LazyBeginConnection`;
* ``tm``: ``with tm.transaction(): with ds.connection() ...`` (one XADataSource,
  one-phase commit, a recovery log that one phase never writes to);
* ``tm0``: ``tm`` with no timeout (``default_timeout=0``): no clock read, so the difference is
  what the default 60 s timeout costs (three reads: the deadline, its checks at the enlistment
  and at the commit);
* ``tmds``: the ``tm`` transaction as one block, ``with ds.transaction() as a`` (the same
  transaction, one ``with`` and one factory call fewer);
* ``tm2``: the same UPDATE in two databases, each through its own XADataSource, the second
  keeping commit marks (as the PostgreSQL WS-RM store does): a two-phase commit, the first
  branch prepared, the second committed in one phase with the decision (``bench_compare``'s
  ``xa2``, without the store);
* ``sql2``: ``tm2``'s statements by psycopg2 alone, its floor: ``BEGIN;`` with the UPDATE in each
  database, ``PREPARE TRANSACTION`` in the first, the commit mark's prepared ``EXECUTE`` (deleting
  the previous transaction's mark) with the ``COMMIT`` in the second, ``COMMIT PREPARED`` in the
  first.

The parts such a transaction is made of, each alone (subtract ``empty``, the loop's own call):
``clock`` (one ``time.monotonic()``: a timeout costs three, see ``tm0``), ``local`` (one read of a
``threading.local`` attribute: the thread's binding), ``ident`` (one ``threading.get_ident()``),
``obj`` (a four-slot object made and freed: a ``with`` block's scope); ``with1`` and ``with2``, the
floor of the API's blocks: one ``with`` block, and two nested (``with tm.transaction(): with
ds.connection() as a:``), of a scope made by a method call whose ``__enter__`` and ``__exit__`` are
Python doing one store each and nothing else: what the blocks cost before any work (CPython 3.11:
3,300 and 6,600, so two blocks alone are already about 11 us at this machine's 0.6 instructions a
nanosecond between round trips under load).

``--calls`` counts instead the Python and C calls per transaction (sys.setprofile); ``--opcodes``
the bytecodes each Python function runs per transaction (sys.settrace, one opcode event each: where
the interpreter's own share of the instructions goes, function by function; ``COUNT_LINES=1``, line
by line, ``COUNT_TOP=60`` to see more of them); ``--wal``
the WAL bytes PostgreSQL wrote per transaction, and by record type (``pg_waldump --stats=record``,
both databases: one server), and the server's CPU per transaction, user and system apart (from
``/proc``: a WAL flush is mostly the system's, ``fdatasync``; a time, so only a guide on a loaded
machine).

Run: .venv/bin/python bench/count_txmanager.py [--paths plain,sql,lazy,tm,tm0,tmds,tm2,sql2] [--calls | --opcodes | --wal]
(or --paths empty,clock,local,ident,obj,with1,with2)
"""

from __future__ import annotations

import argparse
import collections
import linecache
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

UPDATE = "UPDATE account SET balance = balance + %s WHERE id = %s"

_monotonic = time.monotonic


class _FourSlots:
    """The ``obj`` path's object: the size of ``_TransactionScope``."""

    __slots__ = ("a", "b", "c", "d")


class _Block:
    """The ``with1``/``with2`` paths' scope: a method makes it, as ``tm.transaction()`` and
    ``ds.connection()`` make theirs; its ``__enter__`` and ``__exit__`` do one store each."""

    __slots__ = ("_owner", "_timeout", "_tx")
    _owner: Any
    _timeout: Any

    def __enter__(self) -> "_Block":
        self._tx = self
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._tx = None


class _Blocks:
    def block(self, timeout: Any = None) -> _Block:
        scope = _Block()
        scope._owner = self
        scope._timeout = timeout
        return scope


def _tally(install: Any, hook: Any, counter: "collections.Counter[str]", n: int, one: Any, title: str) -> None:
    """Run ``one`` n times with ``hook`` installed (``sys.settrace`` or ``sys.setprofile``), then
    print ``title`` with the count per transaction and the most frequent names (COUNT_TOP)."""
    install(hook)
    for i in range(n):
        one(i)
    install(None)
    print(title.format(sum(counter.values()) / n))
    for name, k in counter.most_common(int(os.environ.get("COUNT_TOP", "12"))):
        print(f"  {k / n:5.1f} {name}")


def _second(dsn: str) -> str:
    """The DSN of the second database (``tm2``): ``dsn``'s, named with a ``2``."""
    from psycopg2.extensions import make_dsn, parse_dsn

    parts = parse_dsn(dsn)
    return make_dsn(**{**parts, "dbname": parts["dbname"] + "2"})


def run(path: str, n: int, dsn: str, calls: bool, wal: Any = None, opcodes: bool = False) -> None:
    """Run ``n`` transactions of ``path`` after 200 of warm-up (this is what valgrind runs); with
    ``wal`` (the server) report the WAL they wrote."""
    import psycopg2

    from txmanager import TransactionManager
    from txmanager.lazy_begin import LazyBeginConnection
    from txmanager.postgres import XADataSource
    from txmanager.xid import Xid

    with tempfile.TemporaryDirectory() as tmp:
        # tm0: no timeout, so no clock is read (what the default 60 s timeout costs)
        tm = TransactionManager(node="count", log=f"{tmp}/tx.log", default_timeout=0 if path == "tm0" else 60.0)
        ds = XADataSource(dsn, tm, register_for_recovery=False)
        ds2 = XADataSource(_second(dsn), tm, register_for_recovery=False, commit_marks=True) \
            if path in ("tm2", "sql2") else None
        plain = psycopg2.connect(dsn)
        auto = psycopg2.connect(dsn)
        auto.autocommit = True
        lazy = psycopg2.connect(dsn, connection_factory=LazyBeginConnection)
        xid = Xid.new_global("count").branch(b"0")

        def one_plain(i: int) -> None:
            with plain.cursor() as c:
                c.execute(UPDATE, (1, i % 10))
            plain.commit()

        def one_sql(i: int) -> None:
            with auto.cursor() as c:
                c.execute("BEGIN;" + UPDATE, (1, i % 10))
            with auto.cursor() as c:
                c.execute("COMMIT")
                assert c.statusmessage == "COMMIT"

        def one_lazy(i: int) -> None:
            lazy.begin_branch(xid)
            with lazy.cursor() as c:
                c.execute(UPDATE, (1, i % 10))
            lazy.commit_branch()

        def one_tm(i: int) -> None:
            with tm.transaction():
                with ds.connection() as a, a.cursor() as c:
                    c.execute(UPDATE, (1, i % 10))

        def one_tmds(i: int) -> None:
            with ds.transaction() as a, a.cursor() as c:
                c.execute(UPDATE, (1, i % 10))

        def one_tm2(i: int) -> None:
            with tm.transaction():
                with ds.connection() as a, a.cursor() as c:
                    c.execute(UPDATE, (1, i % 10))
                with ds2.connection() as b, b.cursor() as c:  # type: ignore[union-attr]
                    c.execute(UPDATE, (1, i % 10))

        if path == "sql2":  # the second database's session, its mark statements prepared
            from txmanager import marks

            auto2 = psycopg2.connect(_second(dsn))
            auto2.autocommit = True
            with auto2.cursor() as c:
                c.execute(marks.CREATE_TABLE)
                c.execute(marks.PREPARE)
            swap = f"EXECUTE {marks.PREPARED_SWAP} ({', '.join(['%s'] * (marks.SWAP_KEYS + 3))}); COMMIT"
            last = ["none"]

        def one_sql2(i: int) -> None:
            gxid = Xid.new_global("count")
            gid = gxid.branch(b"0").to_pg_gid()
            with auto.cursor() as c:
                c.execute("BEGIN;" + UPDATE, (1, i % 10))
            with auto2.cursor() as c:
                c.execute("BEGIN;" + UPDATE, (1, i % 10))
            with auto.cursor() as c:
                c.execute("PREPARE TRANSACTION %s", (gid,))
            key = marks.key(gxid)
            with auto2.cursor() as c:
                c.execute(swap, (*[last[0]] * marks.SWAP_KEYS, key, "count", f'{{"b": ["{gid}"]}}'))
                assert c.statusmessage == "COMMIT"
            last[0] = key
            with auto.cursor() as c:
                c.execute("COMMIT PREPARED %s", (gid,))

        binding = threading.local()
        binding.tx = None

        def one_empty(i: int) -> None:
            pass

        def one_clock(i: int) -> None:
            _monotonic()

        def one_local(i: int) -> None:
            binding.tx  # noqa: B018 -- the read is what is counted

        def one_ident(i: int) -> None:
            threading.get_ident()

        def one_obj(i: int) -> None:
            _FourSlots()

        blocks = _Blocks()

        def one_with1(i: int) -> None:
            with blocks.block():
                pass

        def one_with2(i: int) -> None:
            with blocks.block():
                with blocks.block() as a:  # noqa: F841 -- as the API's second block binds it
                    pass

        one = {"empty": one_empty, "clock": one_clock, "local": one_local, "ident": one_ident, "obj": one_obj,
               "with1": one_with1, "with2": one_with2,
               "plain": one_plain, "sql": one_sql, "lazy": one_lazy, "tm": one_tm, "tm0": one_tm, "tmds": one_tmds,
               "tm2": one_tm2, "sql2": one_sql2}[path]
        for i in range(200):
            one(i)
        if wal is not None:
            start = _wal_position(dsn, checkpoint=True)
            cpu = _server_cpu(wal)
            for i in range(n):
                one(i)
            user, system = (b - a for a, b in zip(cpu, _server_cpu(wal)))
            _print_wal(wal, path, start, _wal_position(dsn), n)
            tick = os.sysconf("SC_CLK_TCK")
            print(f"  PostgreSQL CPU per transaction: user {user * 1e6 / tick / n:.0f} us, "
                  f"system {system * 1e6 / tick / n:.0f} us")
        elif opcodes:
            ran: collections.Counter[str] = collections.Counter()
            by_line = os.environ.get("COUNT_LINES") == "1"

            def trace(frame, event, arg):  # noqa: ANN001 -- sys.settrace's signature
                frame.f_trace_opcodes = True
                if event == "opcode":
                    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_qualname}"
                    if by_line:  # COUNT_LINES=1: by line, with the line's text
                        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno or 0).strip()
                        where = f"{where}:{frame.f_lineno} {line[:70]}"
                    ran[where] += 1
                return trace

            _tally(sys.settrace, trace, ran, n, one, f"{path}: {{:.0f}} bytecodes per transaction")
        elif not calls:
            for i in range(n):
                one(i)
        else:
            counted: collections.Counter[str] = collections.Counter()

            def profile(frame, event, arg):  # noqa: ANN001 -- sys.setprofile's signature
                if event == "call":
                    counted[f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"] += 1
                elif event == "c_call":
                    counted[getattr(arg, "__qualname__", str(arg))] += 1

            _tally(sys.setprofile, profile, counted, n, one, f"{path}: {{:.0f}} calls per transaction")
        ds.close()
        if ds2 is not None:
            ds2.close()
        tm.close()
        if path == "sql2":
            auto2.close()
        for conn in (plain, auto, lazy):
            conn.close()


def _wal_position(dsn: str, checkpoint: bool = False) -> str:
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            if checkpoint:  # no full-page image of a page touched before the count
                cur.execute("CHECKPOINT")
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _server_cpu(pg: Any) -> tuple[int, int]:
    """User and system clock ticks of the server's processes (the backends that ended with theirs)."""
    user = system = 0
    for pid in pg.pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11]) + (int(fields[13]) if pid == pg.pid else 0)
        system += int(fields[12]) + (int(fields[14]) if pid == pg.pid else 0)
    return user, system


def _print_wal(pg: Any, path: str, start: str, end: str, n: int) -> None:
    """The WAL between two positions, per transaction: in all, and by record type."""
    out = subprocess.run([str(pg.bindir / "pg_waldump"), "--stats=record", "-p", str(pg.data_dir / "pg_wal"),
                          "-s", start, "-e", end], capture_output=True, text=True, check=False).stdout
    rows = []
    for line in out.splitlines():
        # "Type  N (%)  record-size (%)  FPI-size (%)  combined (%)", the shares left out
        parts = re.sub(r"\([^)]*\)", " ", line).split()
        if len(parts) == 5 and "/" in parts[0] and parts[1].isdigit() and parts[1] != "0":
            rows.append((int(parts[4]), parts[0], int(parts[1])))
    print(f"{path}: {sum(r[0] for r in rows) / n:,.0f} WAL bytes per transaction")
    for size, kind, count in sorted(rows, reverse=True):
        print(f"  {kind:28} {count / n:5.2f} records {size / n:6.0f} B")


def instructions(path: str, n: int, dsn: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/callgrind.out"
        # one hash seed for every run: dict probes (and so the count) move a few hundred with it
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                        __file__, "--run", path, "--n", str(n), "--dsn", dsn],
                       check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        with open(out) as f:
            return int(re.search(r"^totals: (\d+)", f.read(), re.M).group(1))  # type: ignore[union-attr]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default="plain,sql,lazy,tm")
    p.add_argument("--calls", action="store_true", help="count calls instead of instructions")
    p.add_argument("--opcodes", action="store_true", help="count bytecodes run, by function, instead")
    p.add_argument("--wal", action="store_true", help="count WAL bytes instead of instructions")
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, default=1000, help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        run(args.run, args.n, args.dsn, calls=False)
        return
    from wsrm_plugin.tools.bank import create_bank
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    with ThrowawayPostgres() as pg:
        for name in ("count", "count2"):
            pg.create_database(name)
            create_bank(pg.dsn(name), 10, 1_000_000)
        for path in args.paths.split(","):
            if args.calls or args.wal or args.opcodes:
                run(path, 1000, pg.dsn("count"), calls=args.calls, wal=pg if args.wal else None,
                    opcodes=args.opcodes)
                continue
            per = (instructions(path, 3000, pg.dsn("count")) - instructions(path, 1000, pg.dsn("count"))) / 2000
            print(f"{path}: {per:,.0f} client instructions per transaction")


if __name__ == "__main__":
    main()

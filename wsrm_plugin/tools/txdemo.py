"""The transaction demo: money moves between two PostgreSQL databases, the
application is killed at the worst moments, and recovery puts everything right.

It is what ``wsrm txdemo`` runs.  Each round starts a worker process that runs
transfers and is SIGKILLed at one point of the two-phase commit; a fresh process
then runs the recovery manager over the same log.  After every round the two
banks are audited: the total is unchanged, every transfer is in both ledgers or
in neither, and no prepared transaction is left behind.  The last round kills
the PostgreSQL server itself in the middle of phase 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TextIO

import psycopg2

from wsrm_plugin.tools.bank import audit, create_bank
from wsrm_plugin.tools.pgserver import ThrowawayPostgres

#: (kill point, what the round shows): one round per protocol point.
ROUNDS: list[tuple[str, str]] = [
    ("prepared:0", "killed after the first branch prepared: presumed abort rolls it back"),
    ("before_log", "killed with every branch prepared, no decision logged: rolled back"),
    ("logged", "killed right after the commit decision was logged: recovery commits both"),
    ("committed:0", "killed between the two phase-2 commits: recovery commits the other"),
    ("before_done", "killed before the done record: recovery finds nothing left but the log"),
]

ACCOUNTS = 10
BALANCE = 1_000


def run_worker(
    dsn_a: str, dsn_b: str, log_path: str, *, transfers: int, prefix: str,
    kill_at: str | None = None, kill_tx: int = 0, kill_server_pid: int | None = None,
    seed: int | None = None, kill_after: float | None = None, node: str = "demo-node",
    commit_marks: bool = False,
) -> int:
    """Run the crash worker in a child process; returns its exit status (-9 if killed)."""
    cmd = [
        sys.executable, "-m", "wsrm_plugin.tools.crashworker", "--dsn-a", dsn_a, "--dsn-b", dsn_b,
        "--log", log_path, "--node", node, "--transfers", str(transfers),
        "--accounts", str(ACCOUNTS), "--prefix", prefix, "--kill-tx", str(kill_tx),
    ]
    if kill_at:
        cmd += ["--kill-at", kill_at]
    if kill_server_pid:
        cmd += ["--kill-server-pid", str(kill_server_pid)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if kill_after is not None:
        cmd += ["--kill-after", str(kill_after)]
    if commit_marks:
        cmd.append("--commit-marks")
    # The worker's own warnings (its kill point, a server gone away) are part of
    # the story only with -v; the rounds' summaries say what happened.
    quiet = not logging.getLogger().isEnabledFor(logging.INFO)
    return subprocess.run(cmd, timeout=300,
                          stderr=subprocess.DEVNULL if quiet else None).returncode


def recover_in_fresh_process(log_path: str, dsns: list[str], node: str = "demo-node") -> str:
    """Run ``wsrm recover --auto`` in a new process (as an operator would after a crash)."""
    cmd = [sys.executable, "-m", "txmanager.operator", "--log", log_path, "--node", node,
           "--safety-interval", "0", "--auto"]
    for dsn in dsns:
        cmd += ["--dsn", dsn]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"recovery failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip()


def _prepared(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@contextlib.contextmanager
def _server(dsn: str | None) -> Iterator[tuple[ThrowawayPostgres | None, str, str]]:
    """Two fresh databases on a throwaway server, or on the server ``dsn`` names."""
    if dsn is None:
        with ThrowawayPostgres() as pg:
            pg.create_database("bank_a")
            pg.create_database("bank_b")
            yield pg, pg.dsn("bank_a"), pg.dsn("bank_b")
        return
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        for name in ("wsrm_demo_bank_a", "wsrm_demo_bank_b"):
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
            cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    base = psycopg2.extensions.parse_dsn(dsn)
    yield None, *(
        psycopg2.extensions.make_dsn(**{**base, "dbname": name})
        for name in ("wsrm_demo_bank_a", "wsrm_demo_bank_b")
    )


def run(dsn: str | None = None, transfers: int = 200, out: TextIO = sys.stdout) -> int:
    """Run every round; returns 0 only when every audit passed."""
    started = time.monotonic()
    failures = 0
    with _server(dsn) as (pg, dsn_a, dsn_b), tempfile.TemporaryDirectory() as tmp:
        log_path = os.path.join(tmp, "tx.log")
        expected = 2 * ACCOUNTS * BALANCE
        create_bank(dsn_a, ACCOUNTS, BALANCE)
        create_bank(dsn_b, ACCOUNTS, BALANCE)
        out.write(f"two banks, {ACCOUNTS} accounts each, total {expected}\n")

        rc = run_worker(dsn_a, dsn_b, log_path, transfers=transfers, prefix="warmup", seed=1)
        report = audit(dsn_a, dsn_b, expected)
        out.write(f"[ok] {transfers} transfers without a crash (exit {rc}): {report.summary()}\n")
        failures += not report.ok or rc != 0

        rounds = list(ROUNDS)
        if pg is not None:
            rounds.append(("committed:0", "PostgreSQL itself killed mid-commit, then restarted"))
        for n, (point, story) in enumerate(rounds):
            killed = pg if n == len(ROUNDS) else None  # the extra round, only with a pg
            rc = run_worker(
                dsn_a, dsn_b, log_path, transfers=20, prefix=f"r{n}", kill_at=point, kill_tx=5,
                kill_server_pid=killed.pid if killed is not None else None, seed=n,
            )
            if killed is not None:
                killed.wait_killed()
                killed.start()
            in_doubt = _prepared(dsn_a) + _prepared(dsn_b)
            recovery = recover_in_fresh_process(log_path, [dsn_a, dsn_b])
            report = audit(dsn_a, dsn_b, expected)
            mark = "ok" if report.ok else "FAILED"
            failures += not report.ok
            out.write(
                f"[{mark}] {story}\n       worker exit {rc}, {in_doubt} prepared branch(es) "
                f"in doubt; recovery: {recovery}\n       audit: {report.summary()}\n"
            )
    elapsed = time.monotonic() - started
    out.write(
        f"{'all audits passed' if not failures else f'{failures} audit(s) FAILED'} "
        f"in {elapsed:.1f} s\n"
    )
    return 0 if not failures else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wsrm txdemo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args.dsn, args.transfers)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="an existing PostgreSQL server (default: start a throwaway one)")
    p.add_argument("--transfers", type=int, default=200, help="transfers in the warm-up round")


if __name__ == "__main__":
    sys.exit(main())

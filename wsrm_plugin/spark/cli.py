"""``wsrm spark-recover``: finish a Spark job whose driver (or commit) died.

Branches the driver's recovery log says to commit are committed; every other
prepared branch of the job is rolled back (failed and speculative attempts,
or the whole job when the driver died before deciding).  ``--job`` is the job
id the driver logged at start (``wsrm spark-recover --job 1465012312_...``) or
the job name, for every run of it.  Run it when the job is no longer running.
"""

from __future__ import annotations

from typing import Any

from . import sender as send
from .coordinator import recover_job

__all__ = ["send", "add_recover_arguments", "run_recover"]


def add_recover_arguments(parser: Any) -> None:
    parser.add_argument("--log", required=True, help="the driver's recovery log (the sink's log option)")
    parser.add_argument("--store", required=True, help="the shared message store (postgresql://...)")
    parser.add_argument("--database", default=None, help="the rows' database DSN, if the job wrote rows")
    parser.add_argument("--job", required=True, help="job id (as logged) or job name")
    parser.add_argument("--node", default="spark", help="the driver's node name (the sink's node option)")


def run_recover(args: Any) -> int:
    outcome = recover_job(log_path=args.log, store=args.store, database=args.database, job=args.job,
                          node=args.node)
    print(f"{len(outcome.committed)} committed, {len(outcome.rolled_back)} rolled back, "
          f"{len(outcome.left_to_recovery)} failed (run again)")
    return 1 if outcome.left_to_recovery else 0

"""What an operator runs after a crash: list and resolve in-doubt transactions.

``wsrm recover`` (and ``python -m txmanager.operator``) opens the recovery log
of a node and the resources it used, and shows every branch that is prepared
but not finished, with what the log says about it.  ``--auto`` finishes them
the way the recovery manager would (commit what the log decided, roll back our
other branches); ``--commit``/``--rollback`` impose an operator's decision on
one xid, for the rare case of a lost log.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TextIO

from .log import RecoveryLog
from .postgres import PostgresXAResource
from .recovery import RecoveryManager
from .xa import XAResource
from .xid import Xid, default_node_name

__all__ = ["recovery_manager_for", "recover_postgres", "main", "add_arguments", "run"]


def recovery_manager_for(
    log_path: str, node: str, dsns: Sequence[str], extra: Sequence[XAResource] = (),
    safety_interval: float = 60.0,
) -> RecoveryManager:
    resources: list[XAResource] = [
        PostgresXAResource(dsn) for dsn in dsns
    ]
    resources.extend(extra)
    return RecoveryManager(RecoveryLog(log_path), resources, node, safety_interval=safety_interval)


def recover_postgres(
    log_path: str, node: str, dsns: Sequence[str], safety_interval: float = 0.0
):
    """Recover the given databases with the given log once; returns the report."""
    rm = recovery_manager_for(log_path, node, dsns, safety_interval=safety_interval)
    try:
        return rm.recover_once()
    finally:
        rm.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", required=True, help="the node's recovery log file")
    p.add_argument("--node", default=default_node_name(),
                   help="the node name the transactions were started under (default: hostname)")
    p.add_argument("--dsn", action="append", default=[],
                   help="a PostgreSQL database the node used (repeat for each)")
    p.add_argument("--safety-interval", type=float, default=60.0,
                   help="seconds a prepared branch of ours with no log record must be old "
                        "before --auto rolls it back (default 60; 0 when the node is known dead)")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--auto", action="store_true", help="resolve everything as recovery would")
    act.add_argument("--commit", metavar="XID", help="commit this branch (operator decision)")
    act.add_argument("--rollback", metavar="XID", help="roll back this branch (operator decision)")


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    rm = recovery_manager_for(args.log, args.node, args.dsn, safety_interval=args.safety_interval)
    try:
        if args.auto:
            report = rm.recover_once()
            out.write(f"{report.summary()}\n")
            for error in report.errors:
                out.write(f"error: {error}\n")
            return 0
        if args.commit or args.rollback:
            xid = Xid.from_text(args.commit or args.rollback)
            rm.resolve(xid, commit=bool(args.commit))
            out.write(f"{'committed' if args.commit else 'rolled back'} {xid.to_text()}\n")
            return 0
        rows = rm.in_doubt()
        if not rows:
            out.write("no in-doubt transactions\n")
        for row in rows:
            out.write(f"{row}\n")
        return 0
    finally:
        rm.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wsrm recover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

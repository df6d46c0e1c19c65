"""What an operator runs after a crash: list and resolve in-doubt transactions.

``wsrm recover`` (and ``python -m txmanager.operator``) opens the recovery log
of a node and the resources it used, and shows every branch that is prepared
but not finished, with what the log says about it.  ``--auto`` finishes them
the way the recovery manager would (commit what the log decided, roll back our
other branches -- except in safe mode, see below); ``--commit``/``--rollback``
impose an operator's decision on one xid, for a damaged or lost log.

Fail fast, so that an empty answer means "nothing in doubt" and nothing else:
a ``--log`` that does not exist is never created (exit 2, one line), a
``--node`` the log does not name is refused (exit 2), a resource that cannot
be asked is an error (exit 1), and the answer always names the log, the node
and the databases it looked at.

Safe mode: a log with damage (see :mod:`txmanager.log`) keeps its intact
decisions, but this node's prepared branches that no intact record names are
"held": ``--auto`` leaves them, the listing shows them "unknown".  Decide each
one with ``--commit``/``--rollback``, then ``--end-safe-mode``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TextIO

from .errors import RecoveryLogError, TransactionError
from .log import RecoveryLog
from .postgres import PostgresXAResource
from .recovery import RecoveryManager
from .xa import XAResource
from .xid import Xid

__all__ = ["recovery_manager_for", "recover_postgres", "main", "add_arguments", "run",
           "EXIT_OK", "EXIT_ERRORS", "EXIT_USAGE"]

#: Exit codes: done (or nothing in doubt); some branch or resource could not be
#: handled; the command itself is wrong (log path, node name, xid).
EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


def recovery_manager_for(
    log_path: str, node: str | None, dsns: Sequence[str], extra: Sequence[XAResource] = (),
    safety_interval: float = 60.0,
) -> RecoveryManager:
    """A recovery manager over an EXISTING log (never created here) and the given databases.

    ``node`` None takes the node the log names; a node the log does not name
    raises :class:`RecoveryLogError`."""
    rlog = RecoveryLog(log_path, create=False)
    try:
        node = _check_node(rlog, node)
    except BaseException:
        rlog.close()
        raise
    resources: list[XAResource] = [PostgresXAResource(dsn) for dsn in dsns]
    resources.extend(extra)
    return RecoveryManager(rlog, resources, node, safety_interval=safety_interval)


def _check_node(rlog: RecoveryLog, node: str | None) -> str:
    named = rlog.node()
    if named is None:
        # A log of format 1 (or one never used) does not say; its pending
        # decisions do (their global xids carry the node name).
        owners = {g.node for g in rlog.pending() if g.node is not None}
        if node is None:
            if len(owners) == 1:
                return owners.pop()
            raise RecoveryLogError(f"recovery log {rlog.path} does not name its node; "
                                   "give --node")
        if owners and node not in owners:
            raise RecoveryLogError(f"recovery log {rlog.path} has no decision of node {node!r} "
                                   f"(it has {', '.join(sorted(owners))}); check --node")
        return node
    if node is not None and node != named:
        raise RecoveryLogError(f"recovery log {rlog.path} is the log of node {named!r}, "
                               f"not {node!r}; check --node (or leave it out)")
    return named


def recover_postgres(
    log_path: str, node: str | None, dsns: Sequence[str], safety_interval: float = 0.0
):
    """Recover the given databases with the given log once; returns the report."""
    rm = recovery_manager_for(log_path, node, dsns, safety_interval=safety_interval)
    try:
        return rm.recover_once()
    finally:
        rm.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", required=True, help="the node's recovery log file (must exist)")
    p.add_argument("--node", default=None,
                   help="the node name the transactions were started under (default: the "
                        "node the log names; refused when the log names another)")
    p.add_argument("--dsn", action="append", default=[],
                   help="a PostgreSQL database the node used (repeat for each)")
    p.add_argument("--safety-interval", type=float, default=60.0,
                   help="seconds a prepared branch of ours with no log record must be old "
                        "before --auto rolls it back (default 60; 0 when the node is known dead)")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--auto", action="store_true", help="resolve everything as recovery would")
    act.add_argument("--commit", metavar="XID", help="commit this branch (operator decision)")
    act.add_argument("--rollback", metavar="XID", help="roll back this branch (operator decision)")
    act.add_argument("--end-safe-mode", action="store_true",
                     help="after a damaged log: every held branch has been decided, "
                          "return to presumed abort")


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        rm = recovery_manager_for(args.log, args.node, args.dsn,
                                  safety_interval=args.safety_interval)
    except TransactionError as e:
        err.write(f"wsrm recover: {e}\n")
        return EXIT_USAGE
    try:
        return _run(rm, args, out, err)
    except TransactionError as e:
        err.write(f"wsrm recover: {e}\n")
        return EXIT_ERRORS
    finally:
        rm.close()


def _run(rm: RecoveryManager, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    rlog = rm.log
    assert isinstance(rlog, RecoveryLog)  # recovery_manager_for opened it
    damage = rlog.damaged()
    where = (f"log {args.log} (node {rm.node}, {len(rlog.pending())} decision(s) pending"
             f"{', SAFE MODE: log damaged' if damage else ''}); databases: "
             f"{', '.join(args.dsn) or 'none given (only the log was read)'}")
    if args.end_safe_mode:
        if not damage:
            out.write(f"{where}\nnot in safe mode: nothing to end\n")
            return EXIT_OK
        errors: list[str] = []
        held = [r for r in rm.in_doubt(errors) if r.ours and r.decision.startswith("unknown")]
        for e in errors:
            err.write(f"error: {e}\n")
        if errors or held:
            for row in held:
                err.write(f"held: {row.xid.to_text()} on {row.resource_name}\n")
            err.write("wsrm recover: safe mode NOT ended: decide the held branches with "
                      "--commit/--rollback XID first (and make every database reachable)\n")
            return EXIT_ERRORS
        rlog.end_safe_mode()
        out.write(f"{where}\nsafe mode ended; damage was: {'; '.join(damage)}\n")
        return EXIT_OK
    if args.auto:
        report = rm.recover_once()
        out.write(f"{where}\n{report.summary()}\n")
        if report.held:
            out.write(f"safe mode: {len(report.held)} branch(es) of node {rm.node} held, "
                      "decide each with --commit/--rollback XID, then --end-safe-mode:\n")
            for xid in report.held:
                out.write(f"  {xid.to_text()}\n")
        for error in report.errors:
            err.write(f"error: {error}\n")
        return EXIT_ERRORS if report.errors else EXIT_OK
    if args.commit or args.rollback:
        try:
            xid = Xid.from_text(args.commit or args.rollback)
        except ValueError as exc:
            err.write(f"wsrm recover: not an xid: {exc}\n")
            return EXIT_USAGE
        outcome = rm.resolve(xid, commit=bool(args.commit))
        out.write(f"{outcome} {xid.to_text()}\n")
        return EXIT_OK
    errors = []
    rows = rm.in_doubt(errors)
    out.write(f"{where}\n")
    for e in errors:
        err.write(f"error: {e}\n")
    if not rows:
        out.write("no in-doubt transactions\n" if not errors else
                  "no in-doubt transactions found in the databases that answered\n")
    for row in rows:
        out.write(f"{row}\n")
    return EXIT_ERRORS if errors else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wsrm recover", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""``wsrm nodes``: which host holds which node name, and what each node still has in doubt.

For services on several hosts (:mod:`txmanager.nodes`)::

    wsrm nodes --dsn "host=db dbname=store"
    NODE        EPOCH  HELD  BY                          SINCE                DECISIONS  MARKS  PREPARED
    orders-0        3  yes   10.0.0.10 (txm:orders-0)    2026-11-29 02:10:04          0      0         1
    orders-1        5  free  (taken over by orders-0)    2026-11-29 02:11:40          0      0         0

``HELD`` is whether a live session holds the name's claim now; a free name
was released by its host (or the server ended the session of a dead one)
and is taken over by a watcher within ``host_takeover_within``.
``DECISIONS`` are the node's commit decisions not yet carried out in
``txm_decision``, ``MARKS`` its commit marks in this database, ``PREPARED``
its prepared branches in the whole cluster.  Nothing to do for an operator:
the listing says who is who, and that nothing stays in doubt.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any, TextIO

import psycopg2

from .lease import LOCK_CLASS
from .marks import TABLE as MARK_TABLE
from .xid import Xid

__all__ = ["add_arguments", "run", "rows"]

_NODES = f"""
SELECT n.name, n.epoch, l.pid IS NOT NULL AS held,
       coalesce(host(a.client_addr) || ' (' || a.application_name || ')', n.holder) AS holder,
       n.claimed_at,
       (SELECT count(*) FROM txm_decision d WHERE d.node = n.name AND d.kind = 'commit') AS decisions
  FROM txm_node n
  LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid = {LOCK_CLASS} AND l.objid = n.id AND l.granted
  LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE n.name LIKE %s
 ORDER BY n.id
"""


def rows(conn: Any, prefix: str = "") -> list[dict[str, Any]]:
    """One dict per node name (see the module docstring for the columns)."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('txm_node') IS NOT NULL")
        if not cur.fetchone()[0]:
            return []
        cur.execute(_NODES, (prefix + "%",))
        columns = ("node", "epoch", "held", "holder", "since", "decisions")
        found = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
        marks: Counter[str] = Counter()
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (MARK_TABLE,))
        if cur.fetchone()[0]:
            cur.execute(f"SELECT node, count(*) FROM {MARK_TABLE} GROUP BY node")
            marks.update(dict(cur.fetchall()))
        cur.execute("SELECT gid FROM pg_prepared_xacts")
        prepared = Counter(x.node for (gid,) in cur.fetchall() if (x := Xid.from_pg_gid(gid)) is not None)
    conn.rollback()
    for row in found:
        row["marks"] = marks.get(row["node"], 0)
        row["prepared"] = prepared.get(row["node"], 0)
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", required=True, help="the store's database (libpq DSN), where the claims are")
    parser.add_argument("--prefix", default="", help="only the names of this service (its PostgresNodes prefix)")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import sys

    out = out or sys.stdout
    conn = psycopg2.connect(args.dsn)
    try:
        found = rows(conn, args.prefix)
    finally:
        conn.close()
    if not found:
        print("no node names claimed in this database (txm_node is empty or missing)", file=out)
        return 0
    print(f"{'NODE':<16}{'EPOCH':>6}  {'HELD':<5} {'BY':<40} {'SINCE':<20} {'DECISIONS':>9} {'MARKS':>6} "
          f"{'PREPARED':>8}", file=out)
    for row in found:
        since = row["since"].strftime("%Y-%m-%d %H:%M:%S") if row["since"] else "-"
        print(f"{row['node']:<16}{row['epoch']:>6}  {'yes' if row['held'] else 'free':<5} "
              f"{(row['holder'] or '-')[:40]:<40} {since:<20} {row['decisions']:>9} {row['marks']:>6} "
              f"{row['prepared']:>8}", file=out)
    return 0

"""Does the one-phase path leak?  The resident set size over many transactions, by path.

The C one-phase path (:mod:`txmanager.postgres.accelerated`) counts references by hand; a
reference too many leaks an object per transaction, which ``tracemalloc`` does not see (its
allocations are C's).  This runs ``--n`` transactions of each kind against a throwaway
PostgreSQL and prints the RSS after each tenth: flat after the warm-up means no leak.  The
kinds: ``with ds.transaction() as conn`` and ``with tm.transaction(): with ds.connection()``,
each committing; the same rolled back by an exception in the block; a first statement that
does not parse (the lazy BEGIN's fallback); a deferred constraint failing at the COMMIT (the
commit's failure path, in C calling the Python helpers).

Run: .venv/bin/python bench/rss_onephase.py [--n 100000] (TXMANAGER_PURE_PYTHON=1 for Python)
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import psycopg2

log = logging.getLogger("rss_onephase")


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="transactions of each kind")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from txmanager import TransactionManager
    from txmanager.postgres import XADataSource, accelerated
    from wsrm_plugin.tools.bank import create_bank
    from wsrm_plugin.tools.pgserver import ThrowawayPostgres

    update = "UPDATE account SET balance = balance + %s WHERE id = %s"
    with ThrowawayPostgres() as pg, tempfile.TemporaryDirectory() as tmp:
        pg.create_database("rss")
        dsn = pg.dsn("rss")
        create_bank(dsn, 10, 1_000_000)
        setup = psycopg2.connect(dsn)
        setup.autocommit = True
        with setup.cursor() as cur:
            cur.execute("CREATE TABLE parent (id int PRIMARY KEY)")
            cur.execute("CREATE TABLE child (parent int REFERENCES parent DEFERRABLE INITIALLY DEFERRED)")
        setup.close()
        tm = TransactionManager(node="rss", log=f"{tmp}/tx.log")
        ds = XADataSource(dsn, tm, register_for_recovery=False)
        log.info("one-phase path in %s", "C" if accelerated.enabled() else "Python")

        def tmds(i: int) -> None:
            with ds.transaction() as conn, conn.cursor() as cur:
                cur.execute(update, (1, i % 10))

        def tm_ds(i: int) -> None:
            with tm.transaction():
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute(update, (1, i % 10))

        def raised(i: int) -> None:
            try:
                with ds.transaction() as conn, conn.cursor() as cur:
                    cur.execute(update, (1, i % 10))
                    raise KeyError(i)
            except KeyError:
                pass

        def unparsed(i: int) -> None:
            try:
                with ds.transaction() as conn, conn.cursor() as cur:
                    cur.execute("UPDATE account SET garbage garbage")
            except psycopg2.Error:
                pass

        def deferred(i: int) -> None:
            try:
                with ds.transaction() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO child VALUES (%s)", (i,))
            except Exception:  # noqa: BLE001 -- the RollbackError of the refused COMMIT
                pass

        kinds = {"ds.transaction()": (tmds, args.n), "tm.transaction()+ds.connection()": (tm_ds, args.n),
                 "rolled back": (raised, args.n // 10), "first statement unparsed": (unparsed, args.n // 10),
                 "COMMIT refused": (deferred, args.n // 10)}
        for name, (one, n) in kinds.items():
            for i in range(min(n, 2000)):  # warm-up: the pool, caches, free lists
                one(i)
            sizes = []
            for _tenth in range(10):
                for i in range(n // 10):
                    one(i)
                sizes.append(_rss_kib())
            log.info("%-34s %7d transactions: RSS by tenth (KiB) %s; growth %+d KiB", name, n,
                     " ".join(str(s) for s in sizes), sizes[-1] - sizes[0])
        ds.close()
        tm.close()


if __name__ == "__main__":
    main()

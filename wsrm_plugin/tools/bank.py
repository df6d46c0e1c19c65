"""Two banks in two PostgreSQL databases: the workload of the transaction demo,
the crash tests and the benchmark.

Each transfer debits an account in one database and credits an account in the
other, and writes a ledger row on each side under the same transfer id.  That
makes "all or nothing" checkable after any crash: the two ledgers must hold the
same transfer ids, and the sum of all balances must never change.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import psycopg2

from txmanager.manager import TransactionManager
from txmanager.postgres import XADataSource

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS account (id integer PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    transfer_id text PRIMARY KEY, account integer NOT NULL, delta bigint NOT NULL
);
"""


def create_bank(dsn: str, accounts: int, balance: int) -> None:
    """Create (or reset) one bank's tables with ``accounts`` accounts of ``balance`` each."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(SCHEMA)
            cur.execute("TRUNCATE account, ledger")
            cur.executemany(
                "INSERT INTO account (id, balance) VALUES (%s, %s)",
                [(i, balance) for i in range(accounts)],
            )
    finally:
        conn.close()


def transfer(
    tm: TransactionManager,
    debit: XADataSource,
    credit: XADataSource,
    transfer_id: str,
    from_account: int,
    to_account: int,
    amount: int,
    timeout: float | None = None,
) -> None:
    """Move ``amount`` between the two databases in one global transaction."""
    with tm.transaction(timeout=timeout):
        with debit.connection() as a, a.cursor() as cur:
            cur.execute(
                "UPDATE account SET balance = balance - %s WHERE id = %s", (amount, from_account)
            )
            cur.execute(
                "INSERT INTO ledger (transfer_id, account, delta) VALUES (%s, %s, %s)",
                (transfer_id, from_account, -amount),
            )
        with credit.connection() as b, b.cursor() as cur:
            cur.execute(
                "UPDATE account SET balance = balance + %s WHERE id = %s", (amount, to_account)
            )
            cur.execute(
                "INSERT INTO ledger (transfer_id, account, delta) VALUES (%s, %s, %s)",
                (transfer_id, to_account, amount),
            )


def random_transfers(
    tm: TransactionManager,
    bank_a: XADataSource,
    bank_b: XADataSource,
    count: int,
    accounts: int,
    prefix: str,
    seed: int | None = None,
) -> int:
    """Run ``count`` transfers in random directions; returns how many committed."""
    rng = random.Random(seed)
    done = 0
    for i in range(count):
        src, dst = (bank_a, bank_b) if rng.random() < 0.5 else (bank_b, bank_a)
        transfer(
            tm, src, dst, f"{prefix}-{i}",
            rng.randrange(accounts), rng.randrange(accounts), rng.randint(1, 50),
        )
        done += 1
    return done


@dataclass
class Audit:
    """What a consistency check of the two banks found."""

    total: int
    expected_total: int
    transfers_a: set[str] = field(default_factory=set)
    transfers_b: set[str] = field(default_factory=set)
    prepared_left: list[str] = field(default_factory=list)

    @property
    def half_done(self) -> set[str]:
        """Transfer ids present in one ledger only: an atomicity violation."""
        return self.transfers_a ^ self.transfers_b

    @property
    def ok(self) -> bool:
        return self.total == self.expected_total and not self.half_done and not self.prepared_left

    def summary(self) -> str:
        return (
            f"transfers committed: {len(self.transfers_a & self.transfers_b)}, "
            f"half-done: {len(self.half_done)}, total {self.total} "
            f"(expected {self.expected_total}), prepared left: {len(self.prepared_left)}"
        )


def audit(dsn_a: str, dsn_b: str, expected_total: int) -> Audit:
    """Check both banks: balances, ledgers, and no prepared transaction left behind."""
    result = Audit(total=0, expected_total=expected_total)
    for dsn, ids in ((dsn_a, result.transfers_a), (dsn_b, result.transfers_b)):
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT coalesce(sum(balance), 0) FROM account")
                result.total += int(cur.fetchone()[0])
                cur.execute("SELECT transfer_id FROM ledger")
                ids.update(r[0] for r in cur.fetchall())
                cur.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                )
                result.prepared_left.extend(r[0] for r in cur.fetchall())
        finally:
            conn.close()
    return result

"""The application's database goes away for longer than the retry cycles last, the store in SQLite.

This is the 5-minute failover of the PostgreSQL twin (``test_db_outage_5min_postgres.py``: WCF's
default cycles, 60 s apart, which poison a message about 2 minutes after its first failure),
scaled by a fifth: cycles 12 s apart, a 60 s outage, again over twice the time to the poison
store.  Delivery pauses instead: nothing is counted or poisoned, ``wsrm status`` shows the pause,
and everything is delivered once and in order within seconds of the database's return (issue
30; the scenario: :mod:`.outage`).  The pause's path does not read the cycles' spacing, so the
scale is the test's; the real 5 minutes run in the twin.

Slow: about 1.5 minutes.
"""

from __future__ import annotations

import pytest

from . import outage

SECONDS, CYCLES_APART = 60, 12.0


@pytest.mark.slow(minutes=1.5)
def test_an_outage_past_the_retry_cycles_pauses_delivery_and_loses_duplicates_and_poisons_nothing(
        servers, clients, app_pg, pg_dsn_factory, tmp_path):
    assert SECONDS > 2 * outage.poisoned_after(outage.policy(CYCLES_APART))  # as 5 minutes against 60 s apart
    outage.run(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind="sqlite", seconds=SECONDS, cli=True,
               retry_cycle_delay=CYCLES_APART)

"""The application's database goes away for 5 minutes (a failover), the store in PostgreSQL:
longer than WCF's default retry cycles (3 x 3 attempts, 60 s apart), which would poison the first
message of every busy sequence and hold it for an operator.  Delivery pauses instead: nothing is
counted or poisoned, ``wsrm status`` shows the pause, and everything is delivered once and in
order within seconds of the database's return (issue 30; the scenario: :mod:`.outage`).

The defaults' own scale: its twin in SQLite (``test_db_outage_past_cycles_sqlite.py``) runs
the same path with the cycles and the outage a fifth as long.

Slow: about 5.5 minutes (a file of its own: the README's test command gives it a worker at the start).
"""

from __future__ import annotations

import pytest

from . import outage


@pytest.mark.slow(minutes=5.5)
def test_a_5_minute_database_outage_pauses_delivery_and_loses_duplicates_and_poisons_nothing(
        servers, clients, app_pg, pg_dsn_factory, tmp_path):
    assert 300 > 2 * outage.poisoned_after(outage.policy())  # WCF's cycles would have poisoned meanwhile
    outage.run(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind="postgres", seconds=300, cli=True)

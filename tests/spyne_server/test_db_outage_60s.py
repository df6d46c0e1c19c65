"""The application's database goes away for 60 s (a restart for maintenance): delivery pauses, the
pause shows in ``wsrm status`` (another process), nothing is counted or poisoned, and everything is
delivered once and in order within seconds of its return (issue 30; the scenario: :mod:`.outage`).

Slow: about 75 s per case.
"""

from __future__ import annotations

import pytest

from . import outage


@pytest.mark.slow(minutes=1.5)
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_60s_database_outage_pauses_delivery_and_loses_duplicates_and_poisons_nothing(
        servers, clients, app_pg, pg_dsn_factory, tmp_path, kind):
    outage.run(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind=kind, seconds=60, cli=True)

"""The application's database goes away for 3 s: delivery pauses, nothing is counted or poisoned,
and everything is delivered, once and in order, within seconds of its return (issue 30).

The scenario is in :mod:`.outage`; the 60 s outage and those past the retry cycles have files of
their own (slow).
Each case takes about 20 s.
"""

from __future__ import annotations

import pytest

from . import outage


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_3s_database_outage_pauses_delivery_and_loses_duplicates_and_poisons_nothing(
        servers, clients, app_pg, pg_dsn_factory, tmp_path, kind):
    outage.run(servers, clients, app_pg, pg_dsn_factory, tmp_path, kind=kind, seconds=3, cli=False)

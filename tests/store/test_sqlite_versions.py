"""Two versions of this code never use one SQLite store at once.

From schema version 11 every holder of a SQLite store's file marks the lock
file with its store's token; an earlier version holds the file unmarked, and
this version's receipts would guess past its holds (``written_elsewhere``).
So the migration to 11 is refused while a process of the earlier version has
the file open, and a migrated store is refused by the earlier version.  The
earlier version is played by this code with the later migrations taken away
(``old_schema.old_store``), and its running process by a process that has the
database open.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from wsrm_plugin.store import SchemaVersionError, open_store
from wsrm_plugin.store import sqlite as sqlite_store
from wsrm_plugin.store.sql import LATEST_VERSION, schema

from .old_schema import old_store

#: A process that has the store open (read once, connection kept, as a store's pool keeps it)
#: until its input closes.
_HOLDS_IT_OPEN = (
    "import sqlite3, sys\n"
    "conn = sqlite3.connect(sys.argv[1])\n"
    "conn.execute('SELECT MAX(version) FROM schema_version').fetchall()\n"
    "print('open', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_the_migration_waits_for_no_process_of_the_earlier_version(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    with old_store(url, 10, monkeypatch):
        pass
    earlier = subprocess.Popen([sys.executable, "-c", _HOLDS_IT_OPEN, str(tmp_path / "store.db")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert earlier.stdout.readline() == "open\n"
        with pytest.raises(SchemaVersionError, match=f"process {earlier.pid} has it open"):
            open_store(url)
    finally:
        earlier.communicate("")  # stopped
    store = open_store(url)
    try:
        assert store.schema_version_found == 10
        assert store.schema_version() == LATEST_VERSION
    finally:
        store.close()


def test_a_store_of_this_version_is_refused_by_the_earlier_one(tmp_path, monkeypatch) -> None:
    assert LATEST_VERSION >= 11
    url = f"sqlite:///{tmp_path}/store.db"
    open_store(url).close()
    with monkeypatch.context() as earlier_code:
        earlier_code.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:10])
        earlier_code.setattr(schema, "LATEST_VERSION", 10)
        earlier_code.setattr(sqlite_store, "LATEST_VERSION", 10)
        with pytest.raises(SchemaVersionError, match="newer than this code's 10"):
            open_store(url)


def test_a_process_of_this_version_on_the_file_does_not_stop_its_opening(tmp_path) -> None:
    """Nothing to migrate: another process that has the store open is no earlier version."""
    url = f"sqlite:///{tmp_path}/store.db"
    open_store(url).close()
    other = subprocess.Popen([sys.executable, "-c", _HOLDS_IT_OPEN, str(tmp_path / "store.db")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "open\n"
        open_store(url).close()
    finally:
        other.communicate("")

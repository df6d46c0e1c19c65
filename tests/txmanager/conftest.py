"""Fixtures for the transaction manager's unit tests: real in-memory resources,
a real recovery log in a temporary directory, no PostgreSQL."""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from txmanager import MemoryResource, TransactionManager


class Crash(BaseException):
    """Raised by a checkpoint hook to stop a commit dead, as a kill -9 would.

    A BaseException so no ``except Exception`` in the code under test can
    swallow it -- exactly like a process that simply stops."""


def crash_at(point: str, index: int = 0):
    """A checkpoint hook that 'kills the process' at ``point``/``index``."""
    def hook(p: str, i: int) -> None:
        if p == point and i == index:
            raise Crash(f"{p}:{i}")
    return hook


def work(tx, resource: MemoryResource, key: str, value) -> None:
    """Do one write in ``resource`` inside ``tx`` (enlist, put, delist)."""
    tx.enlist_resource(resource)
    resource.put(key, value)
    tx.delist_resource(resource)


def log_records(path, *, meta: bool = False) -> list[dict]:
    """Read the log file's records with an independent reader of the documented
    format 2 (the log may be open and locked by a manager: reading is fine).
    Records about the log itself (its node, damage) only when ``meta``."""
    from txmanager.log import MAGIC
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(MAGIC)
    off, out = len(MAGIC), []
    while off + 12 <= len(data) and data[off:off + 4] == b"\xf7TxR":
        length, crc = struct.unpack_from(">II", data, off + 4)
        payload = data[off + 12: off + 12 + length]
        if len(payload) != length or zlib.crc32(struct.pack(">I", length) + payload) != crc:
            break
        out.append(json.loads(payload))
        off += 12 + length
    if not meta:
        out = [r for r in out if r["t"] not in ("node", "damage", "repaired", "marks")]
    return out


class Recorder:
    """A Synchronization that writes what happens to it into a shared event list."""

    def __init__(self, events: list, name: str, fail_before: BaseException | None = None,
                 fail_after: BaseException | None = None) -> None:
        self.events, self.name = events, name
        self.fail_before, self.fail_after = fail_before, fail_after

    def before_completion(self) -> None:
        self.events.append(("before", self.name))
        if self.fail_before is not None:
            raise self.fail_before

    def after_completion(self, status) -> None:
        self.events.append(("after", self.name, status))
        if self.fail_after is not None:
            raise self.fail_after


@pytest.fixture
def log_path(tmp_path):
    return tmp_path / "tx.log"


@pytest.fixture
def make_tm(log_path):
    """Factory of managers on the shared log path; every one is closed at the end."""
    made: list[TransactionManager] = []

    def make(**kwargs) -> TransactionManager:
        kwargs.setdefault("node", "test-node")
        kwargs.setdefault("log", log_path)
        kwargs.setdefault("retry_delay", 0.001)
        tm = TransactionManager(**kwargs)
        made.append(tm)
        return tm

    yield make
    for tm in made:
        tm.close()


@pytest.fixture
def tm(make_tm):
    return make_tm()


@pytest.fixture
def a():
    return MemoryResource("a")


@pytest.fixture
def b():
    return MemoryResource("b")


@pytest.fixture
def c():
    return MemoryResource("c")

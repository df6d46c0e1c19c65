"""A full disk under the SQLite store (issue 10, item 1's last point): "retry later", nothing lost.

The store lives on a small tmpfs the test mounts (root only: mounting needs
it).  Ten messages are acknowledged while the service's workers are still
stopped; then a filler file takes the rest of the disk and the workers start:

* every delivery fails to commit (the store cannot write) and is rolled back,
  and is tried again WITHOUT spending the message's delivery attempts (the
  method runs many more times than ``max_delivery_attempts``; before, its
  attempts ran out after three and it was given up -- dropped -- as soon as
  a give-up could commit);
* ten more messages are answered 503 with Retry-After, never 500, and stay
  unacknowledged at the client, which keeps retransmitting them;
* once the filler is deleted, all twenty are delivered exactly once, in
  order: the service's rows are written in the delivery's own store
  transaction, so a row exists exactly when its delivery committed.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from interceptors.spyne_server.reliable import current_delivery
from interceptors.spyne_server.service import reliable_service
from tests.engine.support import wait_for
from tests.spyne_server.conftest import Envelopes
from wsrm_plugin.engine import HttpServer, HttpTransport, ReliableEngine

from .conftest import fast_policy

TNS = "urn:wsrm-disk-full-test"
CALLS: collections.Counter = collections.Counter()  # text -> times the method ran (committed or not)
_lock = threading.Lock()


class NoteService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def note(ctx, text):  # noqa: N805 -- spyne's signature
        with _lock:
            CALLS[text] += 1
        cur = current_delivery().transaction.execute("INSERT INTO app_notes (text) VALUES (?)", (text,))
        cur.close()


def _application() -> Application:
    return Application([NoteService], tns=TNS, name="NoteService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


class _Statuses:
    """WSGI middleware remembering the HTTP status of every answer."""

    def __init__(self, app):
        self.app = app
        self.seen: collections.Counter = collections.Counter()

    def __call__(self, environ, start_response):
        def recording(status, headers, exc_info=None):
            self.seen[int(status.split()[0])] += 1
            return start_response(status, headers, exc_info)
        return self.app(environ, recording)


@pytest.fixture
def small_disk(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root (run the suite as root, as CI does)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        # lazily: this process keeps the store's lock file open (one flock per store file and process)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> int:
    """Write ``path`` until the file system says ENOSPC; the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as filler:
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    filler.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                written += chunk
    return written


def _rows(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT text FROM app_notes ORDER BY rowid")]
    finally:
        conn.close()


def test_a_full_disk_is_retry_later_and_loses_nothing(small_disk: Path, caplog):
    caplog.set_level(logging.WARNING, logger="wsrm_plugin.engine.invoker")
    CALLS.clear()
    db = small_disk / "store.db"
    policy = fast_policy(retry_after=1, max_delivery_attempts=3)
    server = reliable_service(_application(), f"sqlite:///{db}", policy)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE app_notes (text TEXT NOT NULL)")
    conn.commit()
    conn.close()
    statuses = _Statuses(server.wsgi_app)
    http = HttpServer(statuses).start()
    server.engine.endpoint_address = url = http.url
    client = ReliableEngine("memory:", fast_policy(), name="disk-client", transport=HttpTransport(timeout=10))
    client.start()
    try:
        build = Envelopes(url)
        first = [f"n{i:02d}" for i in range(1, 11)]
        for text in first:
            client.send(url, build("note", text), action=f"{TNS}/note")
        assert wait_for(lambda: client.status().unacked == 0)  # all ten acknowledged, none delivered yet
        assert _rows(db) == [] and sum(CALLS.values()) == 0

        filled = _fill(small_disk / "filler")
        assert filled > 0
        server.start()  # the invoker now delivers, and every commit meets the full disk
        second = [f"n{i:02d}" for i in range(11, 21)]
        for text in second:
            client.send(url, build("note", text), action=f"{TNS}/note")
        # the first message is retried well past its 3 attempts: the store's failure is not the message's
        assert wait_for(lambda: CALLS["n01"] >= 3 * policy.max_delivery_attempts, timeout=60), CALLS
        assert wait_for(lambda: statuses.seen[503] >= 10, timeout=60), statuses.seen
        assert _rows(db) == []
        assert client.status().unacked == 10  # what the full store could not take is not acknowledged
        assert statuses.seen[500] == 0
        failures = [r.getMessage() for r in caplog.records if r.name == "wsrm_plugin.engine.invoker"]
        assert failures  # the failed commits were seen...
        # ...but never counted: no "attempt 1 of 3 failed", no "giving up", no poison store
        spent = [m for m in failures if "giving up" in m or "attempt 1 of" in m or "poison" in m]
        assert not spent, spent[:3]

        os.remove(small_disk / "filler")  # space returns
        everything = first + second
        assert wait_for(lambda: len(_rows(db)) >= 20, timeout=120), (_rows(db), statuses.seen)
        assert wait_for(lambda: client.status().unacked == 0, timeout=60)
        assert _rows(db) == everything  # each exactly once, in order
        assert statuses.seen[500] == 0
        print(f"filler {filled} bytes; HTTP statuses {dict(statuses.seen)}; method runs of n01: {CALLS['n01']}")
    finally:
        client.stop(timeout=5)
        http.stop(timeout=5)
        server.stop(timeout=5)

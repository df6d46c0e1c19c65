"""Fixtures shared by the whole suite: one throwaway PostgreSQL server per session.

The server is real (initdb + postgres on 127.0.0.1, see
:mod:`wsrm_plugin.tools.pgserver`); each test that needs a database gets a fresh one,
dropped afterwards together with any prepared transaction left in it, so a
failing test cannot leak locks or use up ``max_prepared_transactions`` for
the tests after it.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator

import psycopg2
import pytest
from hypothesis import HealthCheck, settings

from wsrm_plugin.tools.pgserver import ThrowawayPostgres, find_bindir

log = logging.getLogger(__name__)

#: A property test checks behaviour, not speed: no example has a deadline.  Hypothesis's default
#: (200 ms an example) failed the state machines' property tests on a busy 2-core machine (an
#: example took 288 and 411 ms at a load of 30-50), with nothing wrong; and its too_slow health
#: check failed a test while generating inputs at a load of 55.
settings.register_profile("no-deadline", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("no-deadline")


def pytest_configure(config: pytest.Config) -> None:
    """Nothing to register: the markers live in pyproject.toml."""


def _expected_minutes(item: pytest.Item) -> float:
    """What a test says it takes: ``@pytest.mark.slow(minutes=5)``; a bare ``slow`` is half a minute."""
    marker = item.get_closest_marker("slow")
    if marker is None:
        return 0.0
    return float(marker.kwargs.get("minutes", 0.5))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest test files first, the rest in their usual order.

    The README's test command hands each of its workers a whole file at a time
    (``--dist loadfile --no-loadscope-reorder``): when an eleven-minute file is
    handed out last, the suite takes eleven minutes more than its work needs.
    Longest first (the LPT rule) lets the short files fill in around the long ones.
    """
    per_file: dict[str, float] = {}
    for item in items:
        per_file[item.location[0]] = per_file.get(item.location[0], 0.0) + _expected_minutes(item)
    items.sort(key=lambda item: -per_file[item.location[0]])


def start_throwaway_server(**kwargs) -> ThrowawayPostgres:
    """A started server, or a test failure that says how to install PostgreSQL (never a skip)."""
    try:
        find_bindir()
    except Exception as exc:  # noqa: BLE001 -- report it as the test failure it is
        pytest.fail(f"PostgreSQL is needed by this test: {exc}", pytrace=False)
    server = ThrowawayPostgres(**kwargs)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[ThrowawayPostgres]:
    """The session's server.  A test that kills it must start it again (prepared
    transactions survive that); :func:`pg_dsn_factory` also restarts a dead one."""
    server = start_throwaway_server()
    try:
        yield server
    finally:
        server.close()


def _drop(server: ThrowawayPostgres, name: str) -> None:
    conn = psycopg2.connect(server.dsn(name), connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
            for (gid,) in cur.fetchall():
                cur.execute("ROLLBACK PREPARED %s", (gid,))
    finally:
        conn.close()
    server.drop_database(name)


@pytest.fixture
def pg_dsn_factory(pg_server: ThrowawayPostgres) -> Iterator[Callable[..., str]]:
    """``make(prefix="t", *statements) -> dsn`` of a new, uniquely named database, the
    ``statements`` (an application's tables) run in it first; all dropped at teardown."""
    created: list[str] = []

    def make(prefix: str = "t", *statements: str) -> str:
        if not pg_server.running:
            pg_server.start()
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        dsn = pg_server.create_database(name)
        created.append(name)
        if statements:
            conn = psycopg2.connect(dsn)
            try:
                with conn, conn.cursor() as cur:
                    for statement in statements:
                        cur.execute(statement)
            finally:
                conn.close()
        return dsn

    yield make
    if not pg_server.running:
        pg_server.start()
    for name in created:
        try:
            _drop(pg_server, name)
        except psycopg2.Error as exc:  # a test that still holds a session: harmless leftover
            log.warning("could not drop test database %s: %s", name, exc)


@pytest.fixture
def fresh_db(pg_dsn_factory: Callable[..., str]) -> str:
    """The DSN of a new empty database on the session's server."""
    return pg_dsn_factory()


@pytest.fixture(autouse=True)
def _no_transaction_left_bound():
    """A test that leaves a transaction bound to the thread fails, and the binding is removed:
    otherwise the next test of the same worker finds "a transaction current in this thread"
    (a reliable client then refuses every call), depending on the order tests run in."""
    yield
    from txmanager.manager import current_transactions

    leftover = current_transactions()
    for manager, _ in leftover:
        manager._local.tx = None  # unbind only: the test's own teardown decides its fate
    assert not leftover, f"the test left transaction(s) bound to its thread: {leftover}"


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(certificate, key) PEM files of a self-signed certificate for 127.0.0.1, made by ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("this test needs the openssl command to make its self-signed certificate", pytrace=False)
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=120)
    return cert, key

"""The PostgreSQL store's server goes down (issue 10): "retry later" (503), never 500, nothing lost.

A throwaway PostgreSQL of this test's own is SIGKILLed while a client sends:
the destination answers 503 with Retry-After, the messages stay
unacknowledged at the client, which retransmits them; once the server is
back, every message is delivered exactly once, in order (the application's
row is written in the delivery's own store transaction).
"""

from __future__ import annotations

import collections

import psycopg2
import pytest

from tests.conftest import start_throwaway_server

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for


class _Statuses:
    def __init__(self, app):
        self.app = app
        self.seen: collections.Counter = collections.Counter()

    def __call__(self, environ, start_response):
        def recording(status, headers, exc_info=None):
            self.seen[int(status.split()[0])] += 1
            return start_response(status, headers, exc_info)
        return self.app(environ, recording)


def _rows(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT text FROM app_notes ORDER BY id")
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.mark.postgres
def test_a_store_whose_database_is_down_answers_retry_later_and_loses_nothing(engines):
    pg = start_throwaway_server()
    try:
        dsn = pg.create_database("storedown")
        conn = psycopg2.connect(dsn)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE app_notes (id BIGSERIAL PRIMARY KEY, text TEXT NOT NULL)")
        conn.close()

        def application(envelope: bytes, context) -> None:
            context.transaction.execute("INSERT INTO app_notes (text) VALUES (?)", (item_text(envelope),)).close()

        statuses: list[_Statuses] = []

        def middleware(app):
            statuses.append(_Statuses(app))
            return statuses[-1]

        server = engines("postgresql:" + dsn, fast_policy(retry_after=1), serve=True, middleware=middleware,
                         application=application, name="server")
        client = engines("memory:", fast_policy(), name="client")
        target = server.endpoint_address
        for i in range(5):
            client.send(target, payload(f"m{i}"), action=ACTION)
        assert wait_for(lambda: _rows(dsn) == [f"m{i}" for i in range(5)])

        pg.kill()
        pg.wait_killed()
        for i in range(5, 10):
            client.send(target, payload(f"m{i}"), action=ACTION)
        seen = statuses[0].seen
        assert wait_for(lambda: seen[503] >= 5, timeout=60), seen
        assert client.status().unacked == 5
        assert seen[500] == 0

        pg.start()
        assert wait_for(lambda: client.status().unacked == 0, timeout=90), (client.status(), seen)
        assert wait_for(lambda: len(_rows(dsn)) >= 10, timeout=60)
        assert _rows(dsn) == [f"m{i}" for i in range(10)]  # each exactly once, in order
        assert seen[500] == 0
        print(f"HTTP statuses while the database was down and after: {dict(seen)}")
        server.stop(timeout=5)
    finally:
        pg.close()

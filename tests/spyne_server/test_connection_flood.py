"""A flood of connections costs a reliable service only while it lasts (about 40 s).

``reliable_service(...).serve()`` once died of 1,100 idle connections: waitress's select() loop
met a descriptor past 1,024, its thread ended, and the listening socket stayed open with nobody
behind it.  Here another process opens 2,000 idle connections and 500 requests whose body never
comes, holds them while a reliable client (fresh connections) sends 100 messages, then closes
them: the server's loop never dies, and the 100 messages are all delivered within seconds of the
flood's end.  The times are printed.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time

import pytest

from tests.engine.support import wait_for

from . import service
from .conftest import Envelopes, action, fast_policy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

IDLE, HALF = 2000, 500
#: How long the flood holds once every connection was attempted, while the client tries.
HOLD = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/?wsdl")
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


def test_a_flood_of_idle_and_half_sent_connections_costs_service_only_while_it_lasts(servers, clients):
    # A service has other descriptors open (its store, database connections, log files): with
    # these, 1,000 connections take descriptors past 1,024, where select() gave up.
    ballast = [open(os.devnull, "rb") for _ in range(100)]  # noqa: SIM115 -- held open on purpose
    server = servers("memory:")
    [served] = server._servers
    port, url = served.port, server.url
    build = Envelopes(url)
    warm = clients()
    warm.send(url, build("record", "before"), action=action("record"))
    assert wait_for(lambda: service.recorded() == ["before"])

    flooder = subprocess.Popen([sys.executable, "-m", "tests.spyne_server.flood", "--port", str(port),
                                "--idle", str(IDLE), "--half", str(HALF)], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = flooder.stdout.readline()
        assert line.startswith("FLOODING"), (line, flooder.stderr.read() if flooder.poll() is not None else "")
        connected = int(line.split()[1])
        assert connected >= served.connection_limit  # the server took all it may, the rest wait or gave up
        client = clients(policy=fast_policy(base_retransmission_interval=0.5, max_retransmission_interval=2.0))
        items = [f"f{i}" for i in range(100)]
        for item in items:
            client.send(url, build("record", item), action=action("record"))
        flood_started = time.monotonic()
        while time.monotonic() - flood_started < HOLD:  # the flood lasts: the loop must not die meanwhile
            assert served.alive and served.failure is None
            time.sleep(0.5)
        during = sum(1 for item in service.recorded() if item.startswith("f"))
    finally:
        flooder.stdin.close()
        closed = flooder.stdout.readline()
        flooder.wait(30)
    ended = time.monotonic()
    assert closed.startswith("CLOSED")

    assert wait_for(lambda: _answers(port), timeout=60)
    answering = time.monotonic() - ended
    assert wait_for(lambda: sum(1 for item in service.recorded() if item.startswith("f")) == len(items),
                    timeout=60), service.recorded()
    delivered = time.monotonic() - ended
    print(f"\nflood of {connected} connections (of {IDLE} idle + {HALF} half-sent) held {HOLD:.0f}s, limit "
          f"{served.connection_limit}: {during} of 100 delivered during it; after its end the server answered "
          f"a WSDL fetch in {answering:.2f}s and all 100 were delivered in {delivered:.2f}s")
    assert delivered <= 20.0  # seconds, not the minutes of a dead server
    assert service.recorded() == ["before", *items]  # once each, in order
    assert served.alive and served.restarts == 0 and served.failure is None
    for f in ballast:
        f.close()

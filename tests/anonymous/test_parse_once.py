"""Each message is parsed once along the chain: by the spyne side when it arrives, not again by the
engine, the chain's response, or the delivery; the zeep side hands its tree to the engine, whose
first transmission uses it.

Parses are counted where every safe parse happens (the per-thread lxml parser of
:mod:`wsrm_plugin.wire.xmlsafe`).  Per one-way call over the back-channel: the server
parses the request once (HTTP in), the client parses the HTTP response carrying the
acknowledgement once; spyne's own parse of the request it runs is not ours to count.
Before the change it was 8 per call (164 for 20; server: HTTP in, engine, acknowledgement
response, delivery, spyne's empty one-way answer; client: enqueue, first transmission,
acknowledgement); after, 2 (42 for 20).
"""

from __future__ import annotations

import collections
import threading

from tests.engine.support import wait_for
from wsrm_plugin.wire import xmlsafe

from . import service

CALLS = 20


def test_one_parse_per_message_on_each_side(servers, clients, monkeypatch):
    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)  # the sequences exist; what follows is steady state
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)

    parses: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real_parser = xmlsafe._parser

    def counting_parser():
        with lock:
            parses[threading.current_thread().name] += 1
        return real_parser()

    monkeypatch.setattr(xmlsafe, "_parser", counting_parser)
    for i in range(CALLS):
        rc.service.note(f"n{i}")
    assert wait_for(lambda: all(service.RAN[f"n{i}"] == 1 for i in range(CALLS)), timeout=60), service.RAN
    assert wait_for(lambda: rc.engine.status().unacked == 0, timeout=60)
    monkeypatch.setattr(xmlsafe, "_parser", real_parser)

    total = sum(parses.values())
    # two per call (the request on the server, the response on the client); a little slack for
    # an acknowledgement on its own, or a delivery that ran before its tree was filed
    assert total <= 2.5 * CALLS, f"{total} parses for {CALLS} calls: {dict(parses)}"
    assert total >= CALLS, dict(parses)  # the counter counts: every request is parsed at least once
    print(f"{total} parses for {CALLS} calls: {dict(parses)}")

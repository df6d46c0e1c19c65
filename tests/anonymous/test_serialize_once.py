"""On the server a one-way message's request is stored as the bytes it arrived in (never
serialized again), its acknowledgement is written once, and spyne gets the chain's tree at
delivery: it neither parses the request again nor gets it serialized again.

Serializations are counted where every one happens (``lxml.etree.tostring``), in the server's
threads only (waitress's HTTP threads and the engine's ``wsrm-server`` workers); spyne's
parses where its SOAP protocol parses a request (``soap11._parse_xml_string``).  Per call: the
acknowledgement answered on the back-channel (1), since 20b0258 written as bytes joined from
pieces (``wsrm_plugin.engine.ackanswer``, counted where the answer takes them) rather than
serialized, unless it says more than its ranges.  The request stored was serialized once more
until the chain kept the received bytes past interceptors that only read them
(``Interceptor.changes_received``); before that the acknowledgement was serialized twice, the
request again for spyne, and spyne parsed every delivered request.
"""

from __future__ import annotations

import collections
import threading

from lxml import etree
from spyne.protocol.soap import soap11

from wsrm_plugin.engine import inbound

from tests.engine.support import wait_for

from . import service

CALLS = 20


def _server_thread() -> bool:
    name = threading.current_thread().name
    return name.startswith(("waitress", "wsrm-server"))


def test_server_serializes_each_message_once_and_spyne_reads_the_chains_tree(servers, clients, monkeypatch):
    server = servers()
    rc = clients(server.url)
    rc.service.echo("warm-up").result(timeout=60)  # the sequences exist; what follows is steady state
    assert wait_for(lambda: server.engine.status().unacked == 0 and rc.engine.status().unacked == 0)

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real_tostring, real_parse = etree.tostring, soap11._parse_xml_string

    def counting_tostring(*args, **kwargs):
        if _server_thread():
            with lock:
                counts["tostring"] += 1
        return real_tostring(*args, **kwargs)

    def counting_parse(*args, **kwargs):
        with lock:
            counts["spyne parse"] += 1
        return real_parse(*args, **kwargs)

    real_ack_bytes = inbound.acknowledgement_bytes

    def counting_ack_bytes(*args, **kwargs):
        written = real_ack_bytes(*args, **kwargs)
        if written is not None:
            with lock:
                counts["acknowledgement bytes"] += 1
        return written

    monkeypatch.setattr(etree, "tostring", counting_tostring)
    monkeypatch.setattr(soap11, "_parse_xml_string", counting_parse)
    monkeypatch.setattr(inbound, "acknowledgement_bytes", counting_ack_bytes)
    for i in range(CALLS):
        rc.service.note(f"s{i}")
    assert wait_for(lambda: all(service.RAN[f"s{i}"] == 1 for i in range(CALLS)), timeout=60), service.RAN
    assert wait_for(lambda: rc.engine.status().unacked == 0, timeout=60)
    assert wait_for(lambda: server.engine.status().delivered >= CALLS + 1, timeout=30)
    monkeypatch.setattr(etree, "tostring", real_tostring)
    monkeypatch.setattr(soap11, "_parse_xml_string", real_parse)
    monkeypatch.setattr(inbound, "acknowledgement_bytes", real_ack_bytes)

    assert counts["spyne parse"] == 0, dict(counts)
    # one answer written per call (the acknowledgement, as bytes or serialized); a little slack
    # for an acknowledgement on its own
    written = counts["tostring"] + counts["acknowledgement bytes"]
    assert written <= 1.5 * CALLS, f"{dict(counts)} answers written for {CALLS} calls"
    assert written >= CALLS, dict(counts)  # the counters count: each acknowledgement
    print(f"{counts['tostring']} server serializations for {CALLS} calls: {dict(counts)}")

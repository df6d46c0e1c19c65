"""When something goes wrong on the client's side, the caller knows at once and can act (issue 14).

Each test is what a user meets: their own zeep client after making it
reliable, a bad argument, a service that is down then back, a service
without WS-RM, and waiting for everything to be acknowledged before stopping.
"""

from __future__ import annotations

import collections
import io
import logging
import urllib.request
from pathlib import Path

import pytest
import zeep
import zeep.exceptions

from interceptors.zeep_client.client import (
    NotAcknowledged,
    SequenceFaulted,
    SequenceRefused,
    UnsentMessages,
    reliable_client,
)
from tests.engine.support import wait_for
from wsrm_plugin import cli
from wsrm_plugin.engine import HttpServer, ReliableEngine
from wsrm_plugin.engine.transport import free_port
from wsrm_plugin.metrics import exposition
from wsrm_plugin.status import format_report, report

from . import service
from .conftest import fast_policy

CALLBACK = "tests.zeep_client.service:on_reply"


def _wsdl_for(source: str, address: str, tmp_path: Path) -> Path:
    """The service's WSDL, with its endpoint moved to ``address`` (a port nobody serves yet)."""
    text = urllib.request.urlopen(source + "?wsdl", timeout=10).read().decode()
    path = tmp_path / "service.wsdl"
    path.write_text(text.replace(source, address))
    return path


def test_the_users_own_zeep_client_still_answers_after_reliable_client(plain_server):
    zc = zeep.Client(plain_server + "?wsdl")
    assert zc.service.stock("apples") == 7
    rc = reliable_client(zc, "memory:", fast_policy())
    try:
        assert zc.service.stock("apples") == 7  # a plain synchronous call, as before
        assert rc.engine.store.status().rms == ()  # nothing was enqueued for it
    finally:
        rc.stop(timeout=5)


def test_a_one_way_call_with_a_bad_argument_raises_at_the_call_and_nothing_is_enqueued(clients, server):
    rc = clients()
    with pytest.raises(zeep.exceptions.ValidationError, match="notint") as raised:
        rc.service.reserve(1, 2, "notint")
    assert raised.value.path[-1] == "customer"
    assert rc.engine.store.status().rms == ()  # nothing stored, nothing will be sent
    receipt = rc.service.reserve(1, 2, 3)
    assert receipt.number == 1  # the bad call took no message number
    rc.flush(timeout=30)
    assert service.RESERVED == [(1, 2, 3)]


def test_a_faulted_sequence_tells_the_caller_and_is_resent_once_the_service_is_back(tmp_path, plain_server, capsys):
    service.reset()
    service.REPLIES.clear()
    port = free_port()
    address = f"http://127.0.0.1:{port}/"
    store = f"sqlite:///{tmp_path}/client.db"
    rc = reliable_client(zeep.Client(str(_wsdl_for(plain_server, address, tmp_path))), store,
                         fast_policy(max_retries=3), listen=("127.0.0.1", 0), name="faulted")
    server = None
    try:
        future = rc.service.echo("q1", _callback=CALLBACK, _context="c1")
        rc.service.record("r1")
        error = future.exception(timeout=60)  # the service is down: 3 attempts, then the sequence faults
        assert isinstance(error, SequenceFaulted) and not isinstance(error, SequenceRefused)
        assert "no answer to create sequence after 4 attempts" in str(error)  # the first and 3 retries
        assert wait_for(lambda: service.REPLIES[(f"fault:{error}", "c1")] == 1)

        assert wait_for(lambda: report(rc.engine.store).faulted_sequences == 2)
        shown = format_report(report(rc.engine.store))
        # two sequences: the one-way call's, and the in-out call's (it offers one for the reply)
        assert "faulted sequences         2" in shown
        assert shown.count("no answer to create sequence after 4 attempts") == 2
        assert 'wsrm_faulted_sequence{sequence="(creating: ' in exposition(report(rc.engine.store))
        with pytest.raises(NotAcknowledged, match="faulted") as left:
            rc.flush(timeout=30)
        assert sum(left.value.left.values()) == 2

        receiver = service.SpyneReceiver()  # the service is back
        server = ReliableEngine("memory:", fast_policy(), application=receiver, name="server")
        server.serve("127.0.0.1", port, middleware=receiver.middleware)
        server.start()
        for faulted in left.value.faulted:  # "(creating: KEY)": the service never opened them
            key = faulted.removeprefix("(creating: ").removesuffix(")")
            assert cli.main(["resend", "--store", store, "--sequence", key]) == 0
        assert capsys.readouterr().out.count("1 message(s) moved to new sequence") == 2
        assert wait_for(lambda: service.RECEIVED == ["r1"], timeout=60)
        assert wait_for(lambda: service.REPLIES[("re:q1", "c1")] == 1, timeout=60)
        rc.flush(timeout=30)
        assert report(rc.engine.store).faulted_sequences == 0
        assert service.ECHOED == ["q1"]
    finally:
        rc.stop(timeout=5)
        if server is not None:
            server.stop(timeout=5)


def test_a_service_without_ws_rm_refuses_the_sequence_at_once_and_calls_raise(tmp_path):
    creates = collections.Counter()
    front = service.plain_front()

    def counting(environ, start_response):
        if environ["REQUEST_METHOD"] == "POST":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            creates["CreateSequence" in body.decode("utf-8", "replace")] += 1
            environ["wsgi.input"] = io.BytesIO(body)
        return front(environ, start_response)

    plain = HttpServer(counting, "127.0.0.1", 0).start()
    rc = reliable_client(zeep.Client(plain.url + "?wsdl"), "memory:", fast_policy())
    server = None
    try:
        future = rc.service.echo("q1")
        error = future.exception(timeout=60)
        assert isinstance(error, SequenceRefused)
        # the peer's own fault text, and its code: a service with no WS-Addressing in front of it
        # does not understand the wsa headers the client marks mustUnderstand (SOAP's processing
        # model: refused before anything runs; it was spyne's Sender fault before the adapter
        # applied the rule)
        assert error.reason.startswith(f"CreateSequence refused by {plain.url}: ")
        assert "not understood" in error.reason and "addressing}Action" in error.reason, error.reason
        assert error.reason.endswith("[MustUnderstand]"), error.reason
        assert creates[True] == 1  # refused once: not retried
        with pytest.raises(SequenceRefused, match="refused to open a reliable sequence"):
            rc.service.record("r1")  # the next call is refused at the call site, nothing stored
        assert sum(s.unacked for s in rc.engine.store.status().rms) == 1
        assert "CreateSequence refused" in format_report(report(rc.engine.store))

        port = plain.port
        plain.stop(5)  # the operator puts WS-RM in front of the service, then resends
        plain = None
        receiver = service.SpyneReceiver()
        server = ReliableEngine("memory:", fast_policy(), application=receiver, name="server")
        server.serve("127.0.0.1", port, middleware=receiver.middleware)
        server.start()
        service.reset()
        [result] = rc.resend_faulted()
        assert result.reason.startswith("CreateSequence refused") and len(result.receipts) == 1
        rc.service.record("r2")  # accepted again
        rc.flush(timeout=60)
        assert service.ECHOED == ["q1"] and service.RECEIVED == ["r2"]
    finally:
        rc.stop(timeout=5, discard_unsent=True)
        if plain is not None:
            plain.stop(5)
        if server is not None:
            server.stop(timeout=5)


def test_flush_waits_for_every_acknowledgement_and_stop_keeps_what_memory_would_lose(clients, server, caplog):
    rc = clients()
    for i in range(20):
        rc.service.record(f"r{i}")
    rc.flush(timeout=60)
    assert rc.engine.status().unacked == 0  # flush returned: all acknowledged ...
    # ... which means stored by the service, not yet run: delivery is the invoker's, later.
    assert wait_for(lambda: service.RECEIVED == [f"r{i}" for i in range(20)])

    dead = clients(key="dead")
    dead.zeep.service._binding_options["address"] = f"http://127.0.0.1:{free_port()}/"
    for i in range(3):
        dead.service.record(f"lost{i}")
    with pytest.raises(NotAcknowledged, match="3 message") as left:
        dead.flush(timeout=0.5)
    assert sum(left.value.left.values()) == 3
    with pytest.raises(UnsentMessages, match="3 unacknowledged"):
        dead.stop(timeout=0.5)  # waits that long for them, then refuses to lose them
    with caplog.at_level(logging.WARNING, logger="interceptors.zeep_client.client"):
        dead.stop(timeout=5, discard_unsent=True)
    assert sum("discarding unacknowledged message" in r.getMessage() for r in caplog.records) == 3

"""Replies on the offered sequence are handed out on receipt, exactly once (issue 32, item 8).

Each reply resolves the call it answers (RelatesTo), so a reply the peer is slow
to send again must not hold back the ones after it, as in-order delivery did
(gSOAP's server delivered 200 of 200 requests; the client had handed 8 replies to
the application).  ``RMPolicy(replies_in_order=True)`` keeps the old order.
"""

from __future__ import annotations

import threading

import pytest

from tests.engine.support import ACTION, NS, Recorder, item_text, payload, wait_for
from wsrm_plugin.engine import DeliveryContext, ReliableEngine, RMPolicy

FAST = dict(exponential_backoff=False, poll_interval=0.05, http_timeout=5.0)


class _LoseReply:
    """WSGI middleware in front of the client's listener: every POST carrying reply ``lost`` is
    answered 500 (as a broken proxy would) until :attr:`healed`, so the server keeps sending it."""

    def __init__(self, lost: str) -> None:
        self.lost = lost.encode()
        self.dropped = threading.Event()
        self.healed = threading.Event()

    def __call__(self, app):
        def wsgi(environ, start_response):
            import io

            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
            if self.lost in body and not self.healed.is_set():
                self.dropped.set()
                start_response("500 Internal Server Error", [("Content-Length", "0")])
                return [b""]
            return app(environ, start_response)
        return wsgi


@pytest.mark.parametrize("in_order", [False, True], ids=["on-receipt", "replies_in_order"])
def test_a_lost_reply_holds_back_no_other(in_order: bool):
    def answer(envelope: bytes, context: DeliveryContext) -> None:
        context.reply(payload(f"re:{item_text(envelope)}"), action=f"{NS}:answer")

    server = ReliableEngine("memory:", RMPolicy(base_retransmission_interval=0.2, **FAST), application=answer,
                            name="server")
    server.serve()
    server.start()
    replies = Recorder()
    lose = _LoseReply("re:q0")
    client = ReliableEngine("memory:", RMPolicy(base_retransmission_interval=0.2, replies_in_order=in_order,
                                                **FAST), application=replies, name="client")
    client.serve(middleware=lose)
    client.start()
    try:
        client.send(server.endpoint_address, payload("q0"), action=ACTION, expect_reply=True)
        assert lose.dropped.wait(30)
        for i in range(1, 5):
            client.send(server.endpoint_address, payload(f"q{i}"), action=ACTION, expect_reply=True)
        later = ["re:q1", "re:q2", "re:q3", "re:q4"]
        if in_order:
            # the four later replies arrived, and in order none of them may be handed out yet
            assert wait_for(lambda: [s.received for s in client.store.status().rmd] == ["2-5"], timeout=30)
            assert replies.snapshot() == []
        else:
            assert wait_for(lambda: sorted(replies.snapshot()) == later, timeout=30), replies.snapshot()
        lose.healed.set()
        assert wait_for(lambda: sorted(replies.snapshot()) == ["re:q0", *later], timeout=30), replies.snapshot()
        assert wait_for(lambda: server.status().unacked == 0 and client.status().unacked == 0, timeout=30)
        assert sorted(replies.snapshot()) == ["re:q0", *later]  # each exactly once
        if not in_order:
            assert replies.snapshot()[-1] == "re:q0"
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)

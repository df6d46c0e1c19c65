"""A delivery that commits between the service's look at the replies and its look at the deliveries.

The HTTP thread holding a request whose reply goes back in its response looks for that reply,
and when there is none, whether the request was delivered: delivered without a reply means
none is owed, and the response then only acknowledges the request (the client's request is
done).  On PostgreSQL each statement reads what was committed when it began, so a delivery
committing between the two looks -- its reply with it -- was taken for one owing no reply: the
client had its request acknowledged without the reply and never asked for it again (a call that
never ended: the 30-s stall seen on the XA request-reply path under load).

Real parts: a reliable spyne service on a PostgreSQL store, delivering through its invoker, and
a reliable zeep client without a listener, over loopback HTTP.  The race is provoked, not waited
for: the application runs only once the HTTP thread looked for the reply and found none, and
that thread looks at the deliveries only once the delivery committed.  Polls and retransmissions
come after a minute on both sides, so only the response can answer the call.  A few seconds.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from wsrm_plugin.engine import backchannel

from . import service
from .conftest import fast_policy

pytestmark = pytest.mark.postgres

#: Nothing but the exchange under test answers a call: polls and retransmissions wait a minute.
NO_POLL = dict(poll_interval=60.0, base_retransmission_interval=60.0)


def test_a_reply_committed_between_the_two_looks_goes_back_in_the_response(servers, clients, pg_dsn_factory,
                                                                             monkeypatch):
    looked = threading.Event()     # the HTTP thread looked for the reply, before the delivery
    committed = threading.Event()  # the invoker committed the delivery, its reply with it
    armed = threading.Event()
    replies_of = backchannel.back_channel_replies

    def first_look(tx: Any, identifier: str) -> Any:
        found = replies_of(tx, identifier)
        if armed.is_set() and not looked.is_set() and found == {}:
            looked.set()
            assert committed.wait(30), "the delivery never committed"
        return found
    monkeypatch.setattr(backchannel, "back_channel_replies", first_look)
    delivered = backchannel.BackChannel.delivered

    def after_commit(self: backchannel.BackChannel) -> None:
        if looked.is_set():
            committed.set()
        delivered(self)
    monkeypatch.setattr(backchannel.BackChannel, "delivered", after_commit)  # before the engine binds it

    server = servers(fast_policy(deliver_on_receive=False, **NO_POLL), store="postgresql:" + pg_dsn_factory("bcrace"))
    application = server.engine.invoker.application

    def after_the_look(payload: bytes, context: Any) -> None:
        if armed.is_set():
            assert looked.wait(30), "the HTTP thread never looked for the reply"
        application(payload, context)
    server.engine.invoker.application = after_the_look
    rc = clients(server.url, policy=fast_policy(**NO_POLL))
    assert rc.service.echo("before").result(timeout=60) == "re:before"  # the sequences exist

    armed.set()
    assert rc.service.echo("raced").result(timeout=30) == "re:raced"
    assert looked.is_set() and committed.is_set()
    assert service.RAN["raced"] == 1

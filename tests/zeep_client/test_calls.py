"""One-way and in-out calls of a real zeep client through WS-RM to a real spyne service."""

from __future__ import annotations

import collections
import concurrent.futures
import threading

import pytest
import zeep.exceptions

from tests.engine.support import wait_for
from wsrm_plugin.engine import SendReceipt

from . import service

CALLBACK = "tests.zeep_client.service:on_reply"


def test_one_way_calls_are_enqueued_and_delivered_exactly_once(clients, server):
    rc = clients(key="orders")
    receipts = [rc.service.record(f"m{i}") for i in range(20)]
    assert all(isinstance(r, SendReceipt) for r in receipts)
    assert [r.number for r in receipts] == list(range(1, 21))
    assert wait_for(lambda: len(service.RECEIVED) >= 20)
    rc.close()
    assert wait_for(lambda: not rc.engine.store.status().rms and not server.store.status().rmd)
    assert service.RECEIVED == [f"m{i}" for i in range(20)]


def test_calls_straight_on_the_zeep_client_are_enqueued_too(clients):
    rc = clients()
    assert rc.zeep.service.record("direct") is None
    assert wait_for(lambda: service.RECEIVED == ["direct"])


def test_in_out_returns_a_future_with_the_result(clients):
    rc = clients(listen=("127.0.0.1", 0))
    futures = [rc.service.echo(f"q{i}") for i in range(5)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    assert [f.result(timeout=30) for f in futures] == [f"re:q{i}" for i in range(5)]
    assert rc.pending_futures() == 0


def test_a_future_resolves_on_its_reply_s_record_which_consumes_it(clients, monkeypatch):
    """The reply is in the store when the future resolves, and nothing else is left to do: the
    transaction that records it takes it (Destination.reply_consumers), so no delivery (an
    invoker thread's transaction) follows (the same without a listener:
    tests/anonymous/test_back_channel.py)."""
    rc = clients(listen=("127.0.0.1", 0))
    delivered: list[object] = []
    on_reply = rc._on_reply

    def counted_delivery(*args, **kwargs):
        delivered.append(args)
        return on_reply(*args, **kwargs)

    monkeypatch.setattr(rc, "_on_reply", counted_delivery)
    futures = [rc.service.echo(f"early-{i}") for i in range(3)]
    assert [f.result(timeout=30) for f in futures] == [f"re:early-{i}" for i in range(3)]
    assert rc.engine.store.status().buffered == 0  # taken by its record, never buffered
    assert rc.engine.status().delivered == 3 and rc.engine.status().delivered_on_receipt == 3
    assert delivered == []  # no delivery came after
    assert rc.pending_futures() == 0 and not rc._resolved_on_receipt and not rc._consuming


def test_a_reply_that_cannot_be_consumed_on_its_record_is_delivered_later(clients, monkeypatch):
    """A reply whose consumer says no (here: it cannot be read on its record) is buffered and
    resolves its future in its delivery, as before."""
    rc = clients(listen=("127.0.0.1", 0))
    monkeypatch.setattr(rc, "_consumes_reply", lambda envelope, addressing: False)
    rc.engine.destination.reply_consumers[:] = [rc._consumes_reply]
    assert rc.service.echo("late").result(timeout=30) == "re:late"
    assert wait_for(lambda: rc.engine.store.status().buffered == 0)  # delivered, after the future
    assert wait_for(lambda: rc.engine.status().delivered == 1)
    assert rc.engine.status().delivered_on_receipt == 0


def test_a_fault_is_raised_by_the_future(clients):
    rc = clients(listen=("127.0.0.1", 0))
    future = rc.service.echo("boom")
    with pytest.raises(zeep.exceptions.Fault, match="refuses 'boom'"):
        future.result(timeout=30)


def test_in_out_callback_by_import_path_gets_each_reply_once(clients):
    service.REPLIES.clear()
    rc = clients(listen=("127.0.0.1", 0))
    futures = [rc.service.echo(text, _callback=CALLBACK, _context=f"ctx-{text}") for text in ("a", "b", "boom")]
    for f in futures:
        f.exception(timeout=30)
    assert service.REPLIES == collections.Counter({
        ("re:a", "ctx-a"): 1, ("re:b", "ctx-b"): 1,
        ("fault:the service refuses 'boom'", "ctx-boom"): 1})


def test_bad_callbacks_and_options_are_refused_before_anything_is_stored(clients):
    rc = clients(listen=("127.0.0.1", 0))
    with pytest.raises(ValueError, match="import path"):
        rc.service.echo("x", _callback="not-a-path")
    with pytest.raises(ModuleNotFoundError):
        rc.service.echo("x", _callback="no_such_module_xyz:f")
    with pytest.raises(ValueError, match="one-way"):
        rc.service.record("x", _callback=CALLBACK)
    with pytest.raises(AttributeError):
        rc.service.no_such_operation("x")
    assert rc.engine.store.status().unacked == 0

"""A ``zeep.AsyncClient`` made reliable: awaited calls through the same engine, stores and policy.

Each test runs an asyncio program against the real spyne service on
loopback, with the loop watched (:mod:`tests.aio.loopwatch`): the bridge
must never make the loop wait, so no callback of the loop may run the
engine, the store, zeep's serializers or anything else that blocks (what ran
is asserted; the callbacks' times, which a loaded machine stretches, are
printed).
"""

from __future__ import annotations

import asyncio

import pytest
import zeep
import zeep.exceptions

from interceptors import Interceptor, InterceptorChain, Phase
from interceptors.zeep_client.adapter import engage_client
from interceptors.zeep_client.aio import AsyncReliableClient
from interceptors.zeep_client.errors import TransactionNotJoined
from tests.aio.loopwatch import watch_loop
from tests.engine.support import wait_for
from wsrm_plugin import reliable_client
from wsrm_plugin.engine import SendReceipt

from . import service
from .conftest import fast_policy

CALLBACK = "tests.zeep_client.service:on_reply"


def _client(server, store="memory:", **options):
    return reliable_client(zeep.AsyncClient(server.endpoint_address + "?wsdl"), store, fast_policy(),
                           start=False, **options)


def _stored(rc):
    with rc.engine.store.begin() as tx:
        return sum(seq.highest_number for seq in tx.rms.list_all())


def test_one_way_calls_return_once_stored_and_arrive_in_order(server, tmp_path):
    rc = _client(server, f"sqlite:///{tmp_path}/client.db", key="orders")
    assert isinstance(rc, AsyncReliableClient)

    async def main():
        async with rc:
            receipts = [await rc.service.record(f"m{i}") for i in range(30)]
            stored = await asyncio.to_thread(_stored, rc)  # stored when the await returned
            await rc.flush(timeout=30)
            await rc.close()
        return receipts, stored

    with watch_loop() as loop:
        receipts, stored = asyncio.run(main())
    print(loop.report())
    assert all(isinstance(r, SendReceipt) for r in receipts)
    assert [r.number for r in receipts] == list(range(1, 31))
    assert stored == 30
    assert wait_for(lambda: len(service.RECEIVED) >= 30)
    assert service.RECEIVED == [f"m{i}" for i in range(30)]
    assert loop.callbacks > 0 and not loop.off_loop_calls, loop.report()


def test_request_reply_is_awaited_for_its_result_and_a_fault_is_raised(server):
    rc = _client(server, listen=("127.0.0.1", 0))

    async def main():
        async with rc:
            results = await asyncio.gather(*(rc.service.echo(f"q{i}") for i in range(10)))
            with pytest.raises(zeep.exceptions.Fault, match="refuses 'boom'"):
                await rc.service.echo("boom")
            reply = await rc.enqueue.echo("later")  # stored; the reply is a future of its own
            assert isinstance(reply, asyncio.Future)
            return results, await reply

    with watch_loop() as loop:
        results, later = asyncio.run(main())
    print(loop.report())
    assert sorted(results) == sorted(f"re:q{i}" for i in range(10))
    assert later == "re:later"
    assert loop.callbacks > 0 and not loop.off_loop_calls, loop.report()


def test_a_persisted_callback_gets_the_reply_too(server):
    service.REPLIES.clear()
    rc = _client(server, listen=("127.0.0.1", 0))

    async def main():
        async with rc:
            return await rc.service.echo("cb", _callback=CALLBACK, _context="ctx-cb")

    assert asyncio.run(main()) == "re:cb"
    assert service.REPLIES[("re:cb", "ctx-cb")] == 1


def test_refusals_come_back_to_the_awaiting_task_with_nothing_stored(server):
    rc = _client(server, listen=("127.0.0.1", 0))

    async def main():
        async with rc:
            with pytest.raises(AttributeError):
                getattr(rc.service, "no_such_operation")
            with pytest.raises(ValueError, match="one-way"):
                await rc.service.record("x", _callback=CALLBACK)
            with pytest.raises(ValueError, match="import path"):
                await rc.service.echo("x", _callback="not-a-path")
            return rc.engine.store.status().unacked

    assert asyncio.run(main()) == 0


def test_a_transaction_bound_to_the_loop_thread_is_refused_and_run_in_transaction_joins(server, tmp_path):
    from txmanager import TransactionManager

    tm = TransactionManager(node="aio-client", log=tmp_path / "tm.log")
    rc = _client(server, f"sqlite:///{tmp_path}/client.db", tm=tm)

    def unit(sync, text, fail):
        sync.service.record(text)
        if fail:
            raise RuntimeError("the unit fails after its call")

    async def main():
        async with rc:
            with tm.transaction():
                with pytest.raises(TransactionNotJoined, match="run_in_transaction"):
                    await rc.service.record("bound-to-the-loop")
            with pytest.raises(RuntimeError, match="fails after"):
                await rc.run_in_transaction(unit, "rolled-back", True)
            await rc.run_in_transaction(unit, "committed", False)
            await rc.flush(timeout=30)

    try:
        asyncio.run(main())
    finally:
        tm.close()
    assert wait_for(lambda: service.RECEIVED == ["committed"])


def test_stopping_the_client_cancels_nothing_already_stored(server, tmp_path):
    url = f"sqlite:///{tmp_path}/client.db"
    rc = _client(server, url, key="k")

    async def first():
        await rc.start()
        for i in range(5):
            await rc.service.record(f"s{i}")
        await rc.stop()

    asyncio.run(first())
    again = _client(server, url, key="k")

    async def second():
        async with again:
            await again.flush(timeout=30)

    asyncio.run(second())
    assert wait_for(lambda: service.RECEIVED == [f"s{i}" for i in range(5)])


class _Seen(Interceptor):
    name = "seen"
    phase = Phase.DISPATCH

    def __init__(self):
        super().__init__()
        self.out: list[str | None] = []
        self.into: list[str | None] = []

    def handle_out(self, message):
        self.out.append(message.operation)

    def handle_in(self, message):
        self.into.append(message.operation)


def test_engage_client_runs_a_chain_on_an_async_client(plain_server):
    seen = _Seen()
    client = engage_client(zeep.AsyncClient(plain_server + "?wsdl"), InterceptorChain([seen]))

    async def main():
        return await client.service.echo("plain")

    assert asyncio.run(main()) == "re:plain"
    assert seen.out == ["echo"] and seen.into == ["echo"]

"""Receives of one sequence that arrive together are recorded in one store transaction.

The batch is made deterministic with the store's own lock: the test holds the
sequence's row (a store transaction that read it), so the first receive waits
for it inside its transaction while the next ones queue behind that receive.
"""

from __future__ import annotations

import threading

import pytest

from wsrm_plugin.wire import LastMessageNumberExceeded

from .conftest import fast_policy
from .support import RM10, RM11, Recorder, application_message, post, wait_for
from .test_bad_input import open_sequence


def _store(kind: str, store_for, request) -> str:
    if kind == "postgresql":
        return "postgresql:" + request.getfixturevalue("pg_dsn_factory")("batch")
    return store_for(kind, "s")


def _posting(url: str, body: bytes, into: dict, key: int, **kwargs) -> threading.Thread:
    def run() -> None:
        into[key] = post(url, body, **kwargs)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _queued(server, identifier: str) -> int:
    waiting = server.destination._receipts._waiting.get(identifier)
    return -1 if waiting is None else len(waiting)


def _batch_behind_a_held_row(server, url: str, identifier: str, bodies: dict[int, bytes],
                             **post_kwargs) -> dict:
    """Post ``bodies[1]`` while the test holds the sequence's row, then the others behind it."""
    responses: dict = {}
    threads = []
    with server.store.begin() as held:
        assert held.rmd.get(identifier) is not None
        first, *rest = sorted(bodies)
        threads.append(_posting(url, bodies[first], responses, first, **post_kwargs))
        assert wait_for(lambda: _queued(server, identifier) == 0)  # the first leads, waiting for the row
        for i, number in enumerate(rest, 1):  # one at a time: the batch keeps this order
            threads.append(_posting(url, bodies[number], responses, number, **post_kwargs))
            assert wait_for(lambda: _queued(server, identifier) == i)
    for t in threads:
        t.join(30)
    return responses


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
def test_messages_arriving_during_a_commit_are_recorded_together(engines, store_for, request, kind):
    received = Recorder()
    # memory: asked for (its default is off, a commit there costs nothing worth sharing)
    # batching is for receives not delivered on receipt (which durable stores do by default)
    policy = fast_policy(receive_batch=16) if kind == "memory" else fast_policy(deliver_on_receive=False)
    server = engines(_store(kind, store_for, request), policy, serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    bodies = {n: application_message(RM11, url, identifier, n, f"m{n}") for n in (1, 2, 3, 4)}

    responses = _batch_behind_a_held_row(server, url, identifier, bodies)

    combiner = server.destination._receipts
    assert (combiner.batches, combiner.items) == (2, 4)  # [1], then [2, 3, 4] in one transaction
    for n in (1, 2, 3, 4):
        assert responses[n].status == 200, responses[n].body
    assert wait_for(lambda: received.snapshot() == ["m1", "m2", "m3", "m4"])
    with server.store.begin() as tx:
        assert list(tx.rmd.get(identifier).received.ranges) == [(1, 4)]


def test_a_message_refused_in_a_batch_is_refused_alone(engines, store_for, request):
    """One batch: 2 (the last), 3 (past the last: refused), a duplicate of 1; each its own answer.

    (Four requests at most: the server has four HTTP threads.)"""
    received = Recorder()
    server = engines(_store("postgresql", store_for, request), fast_policy(rm_version=RM10, deliver_on_receive=False),
                     serve=True,
                     application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM10)
    bodies = {
        1: application_message(RM10, url, identifier, 1, "m1"),
        2: application_message(RM10, url, identifier, 2, "m2", last=True),
        3: application_message(RM10, url, identifier, 3, "m3"),
        4: application_message(RM10, url, identifier, 1, "m1 again"),
    }

    responses = _batch_behind_a_held_row(server, url, identifier, bodies)

    combiner = server.destination._receipts
    assert (combiner.batches, combiner.items) == (2, 4)  # the refusal did not break the batch up
    assert isinstance(responses[3].fault(), LastMessageNumberExceeded)
    for n in (1, 2, 4):
        assert responses[n].status == 200, responses[n].body
    assert wait_for(lambda: received.snapshot() == ["m1", "m2"])
    with server.store.begin() as tx:
        seq = tx.rmd.get(identifier)
    assert (list(seq.received.ranges), seq.last_number) == ([(1, 2)], 2)


def test_a_refusal_after_its_writes_rolls_the_batch_back_and_each_is_done_alone(engines, store_for, request):
    """The held-messages limit is checked after the put: the batch cannot keep the others' work
    and drop only that put, so each message is recorded alone, as without batching."""
    received = Recorder()
    server = engines(_store("postgresql", store_for, request), fast_policy(max_unacknowledged_held=2, deliver_on_receive=False),
                     serve=True, application=received)
    url = server.endpoint_address
    identifier = open_sequence(url, RM11)
    # 1 is missing: nothing can be delivered, so 2, 3, 4, 5 are held behind the gap
    bodies = {n: application_message(RM11, url, identifier, n, f"m{n}") for n in (2, 3, 4, 5)}

    responses = _batch_behind_a_held_row(server, url, identifier, {n: bodies[n] for n in (2, 3, 4)})

    ok = sorted(n for n, r in responses.items() if r.status == 200)
    refused = sorted(n for n, r in responses.items() if r.status != 200)
    assert len(ok) == 2 and len(refused) == 1, {n: r.status for n, r in responses.items()}
    assert all(responses[n].status == 503 for n in refused)
    combiner = server.destination._receipts
    assert (combiner.batches, combiner.items) == (2, 1)  # [2] settled; [3, 4] left to be done alone
    with server.store.begin() as tx:
        held = tx.rmd.get(identifier).received
    assert sorted(n for lo, hi in held.ranges for n in range(lo, hi + 1)) == ok
    # the refused ones come again later and are taken once the gap is filled
    # (which of 3 and 4 was refused depends on which of the two, each alone, locked the row first)
    assert post(url, application_message(RM11, url, identifier, 1, "m1")).status == 200
    for n in [*refused, 5]:  # as a source does: again, until the deliveries made room
        assert wait_for(lambda: post(url, bodies[n]).status == 200)
    assert wait_for(lambda: received.snapshot() == ["m1", "m2", "m3", "m4", "m5"])


def test_batching_is_on_where_a_commit_is_costly_and_can_be_turned_off(engines, store_for):
    off = fast_policy(deliver_on_receive=False)
    assert engines(store_for("sqlite", "a"), off).destination._receipts is not None
    assert engines(store_for("memory", "b")).destination._receipts is None
    no_batch = fast_policy(receive_batch=1, deliver_on_receive=False)
    assert engines(store_for("sqlite", "c"), no_batch).destination._receipts is None
    # delivered on receipt (a durable store's default with InOrder delivery): recorded one by one
    on_receipt = engines(store_for("sqlite", "d")).destination
    assert on_receipt._direct is not None and on_receipt._receipts is None
    with pytest.raises(ValueError, match="receive_batch"):
        fast_policy(receive_batch=0)

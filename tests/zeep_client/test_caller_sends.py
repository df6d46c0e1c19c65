"""A caller waiting for its reply sends its own request from its thread (statemachine.lane).

Real parts: a reliable spyne service and reliable zeep clients over loopback HTTP, memory and
SQLite stores.  The request is stored before any thread sends it, the caller's thread claims it as
a sender's round would (so its retransmission timer covers a send the caller started), and what
the caller does not send (it never waits, waits with a short timeout, or the lane is busy) the
sender sends.  Each test waits for what it asserts; about 5 s for the file on a loaded machine.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait

import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.tools.proxy import LossyProxy, lose_first

from . import service
from .conftest import fast_policy


@pytest.fixture
def svc():
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy())
    svc.serve()
    svc.start()
    yield svc
    svc.stop(timeout=5)


def _client(url, store, **policy):
    return reliable_client(zeep.Client(url + "?wsdl"), store, fast_policy(**policy))


def _posting_threads(rc, operation=b"echo"):
    """The names of the threads that POST each application request of ``rc``'s engine (those of
    ``operation``)."""
    threads: list[str] = []
    transport = rc.engine.transport
    send = transport.send

    def recording(address, envelope, headers):
        if operation in envelope and b"CreateSequence" not in envelope:
            threads.append(threading.current_thread().name)
        return send(address, envelope, headers)
    transport.send = recording
    return threads


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_waiting_caller_posts_its_request_and_reads_its_reply_in_its_own_thread(svc, store, tmp_path):
    # a grace long enough that the sender never takes a request its caller is about to send, and
    # no retransmission of a request whose answer is slow on a loaded machine
    rc = _client(svc.url, "memory:" if store == "memory" else f"sqlite:///{tmp_path}/client.db",
                 caller_send_grace=30.0, base_retransmission_interval=30.0)
    try:
        posting = _posting_threads(rc)
        assert rc.service.echo("q0").result(timeout=60) == "re:q0"  # opens the sequence: the sender's
        for i in range(1, 6):
            assert rc.service.echo(f"q{i}").result(timeout=60) == f"re:q{i}"
        me = threading.current_thread().name
        assert posting[1:] == [me] * 5, posting
        assert rc.engine.retransmission.sent_by_callers == 5
        assert service.ECHOED == [f"q{i}" for i in range(6)]
        assert wait_for(lambda: rc.engine.store.status().unacked == 0, timeout=30)
    finally:
        rc.stop(timeout=5)


def test_a_callers_send_that_fails_is_sent_again_by_the_retransmission_timer(svc):
    proxy = LossyProxy(svc.url, script=lose_first(b">lost<"), drop_mode="close").start()
    rc = _client(proxy.url, "memory:", caller_send_grace=30.0)
    try:
        assert rc.service.echo("first").result(timeout=60) == "re:first"
        future = rc.service.echo("lost")
        # the caller's own send is dropped: its timer (0.2 s here) sends it again from the sender
        assert future.result(timeout=60) == "re:lost"
        assert rc.engine.retransmission.sent_by_callers == 1
        assert rc.engine.retransmission.retransmissions >= 1
        assert service.ECHOED == ["first", "lost"]
    finally:
        rc.stop(timeout=5)
        proxy.stop()


def test_a_caller_that_never_waits_gets_its_request_sent_by_the_sender_after_the_grace(svc):
    rc = _client(svc.url, "memory:", caller_send_grace=0.05)
    try:
        posting = _posting_threads(rc)
        futures = [rc.service.echo(f"w{i}") for i in range(5)]
        done, _ = wait(futures, timeout=60)  # not result(): nothing here sends
        assert len(done) == 5
        assert [f.result() for f in futures] == [f"re:w{i}" for i in range(5)]
        assert rc.engine.retransmission.sent_by_callers == 0
        assert threading.current_thread().name not in posting
        assert sorted(service.ECHOED) == [f"w{i}" for i in range(5)]
    finally:
        rc.stop(timeout=5)


def test_a_request_claimed_by_its_enqueue_whose_caller_never_waits_goes_with_the_sender_after_the_grace(svc):
    # once the sequence runs, a request kept for its caller is claimed for it by its enqueue's
    # transaction (its first attempt recorded, due only at its retransmission time): a caller
    # that never sends it must not leave it there until then, nor keep the lane from others
    rc = _client(svc.url, "memory:", caller_send_grace=0.05, base_retransmission_interval=30.0)
    try:
        assert rc.service.echo("first").result(timeout=60) == "re:first"  # opens the sequence: the sender's
        assert rc.service.echo("second").result(timeout=60) == "re:second"  # the caller's, claimed by its enqueue
        sent_by_callers = rc.engine.retransmission.sent_by_callers
        assert sent_by_callers >= 1
        posting = _posting_threads(rc)
        futures = [rc.service.echo(f"w{i}") for i in range(3)]
        done, _ = wait(futures, timeout=20)  # not result(): nothing here sends; 30 s would be the timer
        assert len(done) == 3
        assert [f.result() for f in futures] == [f"re:w{i}" for i in range(3)]
        assert rc.engine.retransmission.sent_by_callers == sent_by_callers  # none by a caller since
        assert threading.current_thread().name not in posting
        assert rc.service.echo("after").result(timeout=60) == "re:after"  # the lane is free again
        assert rc.engine.retransmission.sent_by_callers == sent_by_callers + 1
        assert service.ECHOED == ["first", "second", "w0", "w1", "w2", "after"]
    finally:
        rc.stop(timeout=5)


def test_a_short_timeout_leaves_the_request_to_the_sender_at_once(svc):
    rc = _client(svc.url, "memory:", caller_send_grace=30.0)
    try:
        assert rc.service.echo("first").result(timeout=60) == "re:first"
        future = rc.service.echo("short")
        # shorter than the longest send (twice the 5 s HTTP timeout): the caller must not send it,
        # and the sender sends it now, not when the 30 s grace ends
        with pytest.raises(TimeoutError):
            future.result(timeout=0.0)
        assert future.result(timeout=9.0) == "re:short"
        assert rc.engine.retransmission.sent_by_callers == 0
    finally:
        rc.stop(timeout=5)


def test_callers_on_one_sequence_from_many_threads_each_get_their_own_reply_once(svc):
    rc = _client(svc.url, "memory:")
    answers: dict[str, str] = {}
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for i in range(10):
                text = f"t{n}-{i}"
                answers[text] = rc.service.echo(text).result(timeout=60)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert answers == {f"t{n}-{i}": f"re:t{n}-{i}" for n in range(4) for i in range(10)}
        assert sorted(service.ECHOED) == sorted(answers)  # each ran once
    finally:
        rc.stop(timeout=5)


def test_a_sqlite_service_delivering_apart_answers_each_request_at_its_first_delivery(tmp_path):
    # a SQLite service delivering on receipt apart from the receive (deliver_apart:
    # InvokerWorker.deliver_received) enqueues the reply before the buffer row is marked delivered,
    # which the lock order check refused: every request-reply call's first delivery failed, ran
    # the application twice and waited for a retry
    service.reset()
    svc = reliable_service(service.spyne_app(), f"sqlite:///{tmp_path}/service.db",
                           fast_policy(deliver_apart=True))
    assert svc.engine.invoker.delivers_apart
    svc.serve()
    svc.start()
    rc = _client(svc.url, "memory:")
    try:
        for i in range(5):
            assert rc.service.echo(f"s{i}").result(timeout=60) == f"re:s{i}"
        assert svc.engine.status().delivery_failures == 0
        assert service.ECHOED == [f"s{i}" for i in range(5)]
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)


# -- one-way calls (policy one_way_caller_sends: by default while several sequences are busy) ----------


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_one_way_caller_posts_its_own_message_once_its_sequence_runs(svc, store, tmp_path):
    # the first call opens the sequence: the sender's round sends it with the CreateSequence, and
    # the caller waits for that send (paced); every later call is sent from the caller's thread.
    # The grace keeps each message for its caller while it waits for a round to leave the lane:
    # the second call comes while the first's round still applies its acknowledgement, and with
    # the default 10 ms the sender's next round, starting before the waiting caller woke, took
    # that message (seen once under load on SQLite; every time with that round's commit delayed)
    rc = _client(svc.url, "memory:" if store == "memory" else f"sqlite:///{tmp_path}/client.db",
                 base_retransmission_interval=30.0, one_way_caller_sends=True, caller_send_grace=30.0)
    try:
        posting = _posting_threads(rc, b"record")
        rc.service.record("o0")
        sender = rc.engine.retransmission
        assert sender.callers_paced == 1
        assert sender.messages_sent == 1  # sent before the call returned
        for i in range(1, 6):
            rc.service.record(f"o{i}")
        me = threading.current_thread().name
        assert posting[1:] == [me] * 5, posting
        assert sender.sent_by_callers == 5
        assert wait_for(lambda: len(service.RECEIVED) == 6, timeout=30)
        assert service.RECEIVED == [f"o{i}" for i in range(6)]
        assert wait_for(lambda: rc.engine.store.status().unacked == 0, timeout=30)
    finally:
        rc.stop(timeout=5)


def test_a_single_callers_one_way_messages_go_with_the_sender_by_default(svc):
    rc = _client(svc.url, "memory:")
    try:
        posting = _posting_threads(rc, b"record")
        for i in range(4):
            rc.service.record(f"s{i}")
        assert wait_for(lambda: len(service.RECEIVED) == 4, timeout=30)
        assert rc.engine.retransmission.sent_by_callers == 0
        assert rc.engine.retransmission.callers_paced == 0
        assert threading.current_thread().name not in posting
        assert service.RECEIVED == [f"s{i}" for i in range(4)]
    finally:
        rc.stop(timeout=5)


def test_a_one_way_callers_send_that_is_lost_is_sent_again_by_the_retransmission_timer(svc):
    proxy = LossyProxy(svc.url, script=lose_first(b">lost<"), drop_mode="close").start()
    rc = _client(proxy.url, "memory:", caller_send_grace=30.0, one_way_caller_sends=True)
    try:
        rc.service.record("first")
        rc.service.record("lost")  # the caller's own send, dropped: the call returns all the same
        assert rc.engine.retransmission.sent_by_callers == 1
        assert wait_for(lambda: len(service.RECEIVED) == 2, timeout=60)  # the timer (0.2 s here) sends it again
        # counted once the resend's answer is read, which may come after the service ran it
        assert wait_for(lambda: rc.engine.retransmission.retransmissions >= 1, timeout=30)
        assert service.RECEIVED == ["first", "lost"]
    finally:
        rc.stop(timeout=5)
        proxy.stop()


def test_one_way_callers_of_many_sequences_each_message_delivered_once_in_order(svc):
    clients = _clients_of_six_sequences(svc.url, one_way_caller_sends=True)
    try:
        _in_threads(clients, "m", 15)
        assert wait_for(lambda: len(service.RECEIVED) == 90, timeout=60)
        assert sorted(service.RECEIVED) == sorted(f"m{n}-{i}" for n in range(6) for i in range(15))
        for n in range(6):  # each sequence in its order
            mine = [text for text in service.RECEIVED if text.startswith(f"m{n}-")]
            assert mine == [f"m{n}-{i}" for i in range(15)]
        assert clients[0].engine.retransmission.sent_by_callers > 0
    finally:
        clients[0].stop(timeout=5)


# -- the automatic setting (None, the default), and a peer that is slow or down -------------------------

_KEYS = ["", *(f"k{n}" for n in range(1, 6))]  # six sequences: more than engine.busy.BUSY_AT


def _clients_of_six_sequences(url, store="memory:", **policy):
    first = reliable_client(zeep.Client(url + "?wsdl"), store, fast_policy(**policy), active_keys=_KEYS)
    return [first, *(first.with_key(key) for key in _KEYS[1:])]


def _in_threads(clients, label: str, count: int) -> list[float]:
    """Each client calls ``record`` ``count`` times from a thread of its own; the longest call (s)."""
    longest: list[float] = []
    errors: list[BaseException] = []

    def caller(n: int) -> None:
        try:
            for i in range(count):
                started = time.monotonic()
                clients[n].service.record(f"{label}{n}-{i}")
                longest.append(time.monotonic() - started)
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    return sorted(longest)[-1:] or [0.0]


def _each_once_in_order(labels: list[tuple[str, int]], sequences: int = 6) -> None:
    expected = [f"{label}{n}-{i}" for label, count in labels for n in range(sequences) for i in range(count)]
    assert wait_for(lambda: len(service.RECEIVED) >= len(expected), timeout=60)
    assert sorted(service.RECEIVED) == sorted(expected)  # each once
    for n in range(sequences):  # each sequence in its order
        mine = [text for text in service.RECEIVED if text.split("-")[0][-1:] == str(n)]
        assert mine == [f"{label}{n}-{i}" for label, count in labels for i in range(count)]


def test_one_way_callers_of_several_busy_sequences_send_their_own_messages_by_default(svc):
    # the automatic setting: one caller keeps the sender (above); six sequences busy at once are
    # paced, their callers sending their own messages once their sequences run
    clients = _clients_of_six_sequences(svc.url)
    sender = clients[0].engine.retransmission
    try:
        for n, client in enumerate(clients):  # opens each sequence (the sender's, with its CreateSequence)
            client.service.record(f"a{n}-0")
        _in_threads(clients, "b", 10)
        assert sender.sent_by_callers > 0
        _each_once_in_order([("a", 1), ("b", 10)])
    finally:
        clients[0].stop(timeout=5)


def test_one_way_callers_of_several_busy_sequences_on_a_sqlite_store_leave_their_messages_to_the_sender(
        svc, tmp_path):
    # the automatic setting on a SQLite client store: the callers' own sends would each cost a
    # commit and a flush there that the sender's rounds share (RMPolicy.one_way_caller_sends)
    clients = _clients_of_six_sequences(svc.url, f"sqlite:///{tmp_path}/client.db")
    sender = clients[0].engine.retransmission
    try:
        for n, client in enumerate(clients):
            client.service.record(f"a{n}-0")
        _in_threads(clients, "b", 10)
        assert sender.sent_by_callers == 0
        _each_once_in_order([("a", 1), ("b", 10)])
    finally:
        clients[0].stop(timeout=5)


@pytest.mark.parametrize("down", ["refused", "silent"])
def test_the_automatic_setting_leaves_one_way_messages_to_the_sender_while_the_peer_fails(svc, down):
    # a peer that refuses connections, or takes them and never answers: a caller whose own send
    # meets it returns once its send failed (at most http_timeout, 2 s here); the calls after it
    # are left to the sender (returning once stored, none paced), and nothing is lost or repeated
    # (the peer never judged unreachable: its messages stay due, each on its timer, and a caller
    # may still send its own; the automatic setting sees the failure in its last exchange)
    proxy = LossyProxy(svc.url, drop_mode="timeout", drop_timeout=60.0).start()
    clients = _clients_of_six_sequences(proxy.url, http_timeout=2.0, base_retransmission_interval=0.5,
                                        peer_unreachable_after=None)
    sender = clients[0].engine.retransmission
    try:
        for n, client in enumerate(clients):
            client.service.record(f"a{n}-0")
        _in_threads(clients, "b", 5)
        assert sender.sent_by_callers > 0
        if down == "refused":
            port = proxy.port
            proxy.stop()
        else:
            proxy.drop = 1.0
        failures = sender.send_failures
        longest = _in_threads(clients, "c", 1)  # some may meet the failure themselves
        assert longest[0] < 2.0 + 3.0  # http_timeout, and a margin for a loaded machine: no hang
        assert wait_for(lambda: sender.send_failures > failures, timeout=30)
        by_callers, paced = sender.sent_by_callers, sender.callers_paced
        _in_threads(clients, "d", 5)
        assert (sender.sent_by_callers, sender.callers_paced) == (by_callers, paced)  # left to the sender
        if down == "refused":
            proxy = LossyProxy(svc.url, listen=("127.0.0.1", port)).start()
        else:
            proxy.drop = 0.0
        _each_once_in_order([("a", 1), ("b", 5), ("c", 1), ("d", 5)])
    finally:
        clients[0].stop(timeout=5)
        proxy.stop()


def test_a_one_way_caller_whose_own_send_meets_a_silent_peer_returns_after_the_http_timeout(svc):
    # one_way_caller_sends=True: the caller's own send is the one that waits for the peer
    proxy = LossyProxy(svc.url, drop_mode="timeout", drop_timeout=60.0).start()
    rc = _client(proxy.url, "memory:", one_way_caller_sends=True, http_timeout=2.0)
    sender = rc.engine.retransmission
    try:
        rc.service.record("first")  # opens the sequence
        rc.service.record("second")
        assert sender.sent_by_callers == 1
        proxy.drop = 1.0
        started = time.monotonic()
        rc.service.record("lost")  # the caller's own send: never answered
        assert time.monotonic() - started < 2.0 + 3.0  # http_timeout, and a margin: no hang
        assert sender.sent_by_callers == 2 and sender.send_failures >= 1
        proxy.drop = 0.0
        assert wait_for(lambda: len(service.RECEIVED) == 3, timeout=60)  # its timer sends it again
        assert service.RECEIVED == ["first", "second", "lost"]
    finally:
        rc.stop(timeout=5)
        proxy.stop()


def test_paced_one_way_callers_do_not_wait_for_a_sequence_their_peer_never_opened(svc):
    # one_way_caller_sends=True and the peer down before the first call: the callers waited for a
    # round to send their messages, which none could before a CreateSequence was answered, so
    # each call took the whole http_timeout (30 s here).  Now the failed CreateSequence lets the
    # first go on, and the later ones do not wait while the peer fails.
    proxy = LossyProxy(svc.url).start()
    rc = _client(proxy.url, "memory:", one_way_caller_sends=True, http_timeout=30.0)
    port = proxy.port
    proxy.stop()
    try:
        for i in range(3):
            started = time.monotonic()
            rc.service.record(f"early{i}")
            assert time.monotonic() - started < 10.0  # not the 30 s http_timeout
        assert rc.engine.retransmission.sent_by_callers == 0
        proxy = LossyProxy(svc.url, listen=("127.0.0.1", port)).start()
        assert wait_for(lambda: len(service.RECEIVED) == 3, timeout=60)
        assert service.RECEIVED == ["early0", "early1", "early2"]
    finally:
        rc.stop(timeout=5)
        proxy.stop()

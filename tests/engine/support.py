"""Helpers shared by the engine tests and the peer process: envelopes, raw posts, a recorder.

Everything here talks real HTTP to real engines; the hand-built messages are
for bad-input tests, which must put on the wire what no well-behaved engine
would send.
"""

from __future__ import annotations

import http.client
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from lxml import etree

from wsrm_plugin.wire import (
    RM10, RM11, SOAP11, SOAP12, AddressingHeaders, CreateSequence, EndpointReference, Envelope,
    RMVersion, SequenceHeader, SoapVersion, build_envelope, new_message_id, parse_envelope, to_bytes,
)

NS = "urn:wsrm-engine-test"
ACTION = "urn:wsrm-engine-test:deliver"


def payload(text: str, soap: SoapVersion = SOAP12) -> bytes:
    """An application envelope whose body is ``<t:item>text</t:item>`` (no WS-A, no WS-RM yet)."""
    item = etree.Element(f"{{{NS}}}item", nsmap={"t": NS})
    item.text = text
    return to_bytes(build_envelope(soap, [], item))


def item_text(envelope: bytes) -> str | None:
    root = etree.fromstring(envelope)
    return root.findtext(f".//{{{NS}}}item")


class Recorder:
    """An application handler that remembers what it was given, in order (thread-safe)."""

    def __init__(self, fail_on: Callable[[str | None], bool] | None = None) -> None:
        self.items: list[str | None] = []
        self.contexts: list[object] = []
        self._lock = threading.Lock()
        self._fail_on = fail_on
        self.calls = 0

    def __call__(self, envelope: bytes, context: object) -> None:
        text = item_text(envelope)
        with self._lock:
            self.calls += 1
        if self._fail_on is not None and self._fail_on(text):
            raise RuntimeError(f"the application refuses {text!r}")
        with self._lock:
            self.items.append(text)
            self.contexts.append(context)

    def snapshot(self) -> list[str | None]:
        with self._lock:
            return list(self.items)


def holding_at(text: str) -> tuple[Recorder, threading.Event, Callable[[bytes, object], None]]:
    """An application that records what it is given and, given ``text``, holds it until the event
    returned is set: (what it received, that event, the application)."""
    received = Recorder()
    release = threading.Event()

    def application(envelope: bytes, context: object) -> None:
        received(envelope, context)
        if received.snapshot()[-1] == text:
            assert release.wait(30)
    return received, release, application


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.02) -> bool:
    """Poll until ``predicate()``; a generous timeout only guards against hangs."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def batches_on_disk(combiner, store, commit_of: Callable[[object], object]) -> list[tuple[int, bool, int]]:
    """Each batch ``combiner`` runs from now on, as it returns (and wakes its other receives):
    its size, whether the commit of every outcome (``commit_of(outcome)``, its transaction, or
    None for one without) was on ``store``'s disk, and the batches the combiner handed on so far."""
    returned: list[tuple[int, bool, int]] = []
    run, sync = combiner._batch, store._sync

    def watched(items: list[object]) -> list[object]:
        outcomes = run(items)
        seqs = [tx._commit_seq for tx in map(commit_of, outcomes) if tx is not None]
        returned.append((len(items), bool(seqs) and sync._synced >= max(seqs), combiner.handed_on))
        return outcomes

    combiner._batch = watched
    return returned


# -- hand-built protocol messages ------------------------------------------------------------

def _addressing(rm: RMVersion, to: str, action: str, reply_to: str | None = None) -> AddressingHeaders:
    wsa = rm.addressing
    return AddressingHeaders(to=to, action=action, message_id=new_message_id(),
                             reply_to=EndpointReference(reply_to or wsa.anonymous), version=wsa)


def create_sequence(rm: RMVersion, to: str, soap: SoapVersion = SOAP12) -> bytes:
    wsa = rm.addressing
    body = CreateSequence(EndpointReference(wsa.anonymous)).to_xml(rm, wsa)
    headers = _addressing(rm, to, rm.create_sequence_action).to_elements(wsa, soap=soap)
    return to_bytes(build_envelope(soap, headers, body))


def application_message(rm: RMVersion, to: str, identifier: str, number: int | str, text: str, *,
                        last: bool = False, soap: SoapVersion = SOAP12,
                        extra_headers: Iterable[etree._Element] = ()) -> bytes:
    """An application message with a Sequence header; ``number`` may be any text (bad input)."""
    wsa = rm.addressing
    headers = _addressing(rm, to, ACTION).to_elements(wsa, soap=soap)
    if isinstance(number, int) and 1 <= number < 2**63:
        sequence = SequenceHeader(identifier, number, last_message=last).to_xml(rm, soap)
    else:  # what the wire classes refuse to write
        sequence = SequenceHeader(identifier, 1, last_message=last).to_xml(rm, soap)
        sequence.find(rm.qname("MessageNumber").text).text = str(number)
    item = etree.Element(f"{{{NS}}}item", nsmap={"t": NS})
    item.text = text
    return to_bytes(build_envelope(soap, [*headers, sequence, *extra_headers], item))


def protocol_request(rm: RMVersion, to: str, action: str, body: etree._Element | None,
                     headers: Iterable[etree._Element] = (), soap: SoapVersion = SOAP12) -> bytes:
    wsa = rm.addressing
    blocks = [*_addressing(rm, to, action).to_elements(wsa, soap=soap), *headers]
    return to_bytes(build_envelope(soap, blocks, body))


@dataclass
class RawResponse:
    status: int
    body: bytes
    headers: dict[str, str]

    def envelope(self) -> Envelope:
        return parse_envelope(self.body)

    def fault(self):
        return self.envelope().fault()


def post(url: str, body: bytes, *, soap: SoapVersion = SOAP12, headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> RawResponse:
    """POST raw bytes with one fresh connection (no engine logic in between)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        all_headers = {**soap.http_headers(None), **(headers or {})}
        conn.request("POST", parts.path or "/", body=body, headers=all_headers)
        response = conn.getresponse()
        return RawResponse(response.status, response.read(), dict(response.getheaders()))
    finally:
        conn.close()


# -- a delivery log in SQLite, for processes that must be checked from outside -------------------

class DeliveryLog:
    """Delivered messages in an SQLite file: one row per hand-over, duplicates included.

    The peer process writes it; a test reads it after the peer exits (or was
    killed), so exactly-once is checked on what really happened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS delivered (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                           "sequence_id TEXT, number INTEGER, message_id TEXT, item TEXT, at REAL)")

    def record(self, sequence_id: str, number: int, message_id: str | None, item: str | None) -> None:
        with self._lock:
            self._conn.execute("INSERT INTO delivered (sequence_id, number, message_id, item, at) "
                               "VALUES (?, ?, ?, ?, ?)", (sequence_id, number, message_id, item, time.time()))

    def items(self) -> list[str]:
        with self._lock:
            return [row[0] for row in self._conn.execute("SELECT item FROM delivered ORDER BY id")]

    def close(self) -> None:
        self._conn.close()


__all__ = [
    "NS", "ACTION", "RM10", "RM11", "SOAP11", "SOAP12", "payload", "item_text", "Recorder", "wait_for",
    "create_sequence", "application_message", "protocol_request", "post", "RawResponse", "DeliveryLog",
]

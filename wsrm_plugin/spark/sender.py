"""The long-running sender: the RMS worker over the shared message store (``wsrm send``).

Executors only enqueue (and may be gone long before delivery); this process
creates the sequences, (re)transmits every committed message until the
service acknowledges it, and closes and terminates each task attempt's
sequence once it is complete.  Several senders may share a store (the
store's pollers skip what another one holds).  It serves no endpoint:
acknowledgements come back on the HTTP responses (AcksTo anonymous).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from ..engine import ReliableEngine, RMPolicy
from ..store import StorageManager, open_store
from ..wire.namespaces import SOAP11

__all__ = ["Sender", "SenderProgress", "run_sender"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SenderProgress:
    """What is still to do in the store, and what this sender did."""

    open_sequences: int
    unacked: int
    prepared: int
    sent: int
    retransmissions: int

    @property
    def idle(self) -> bool:
        """Nothing left: every committed message acknowledged, every sequence ended, and no
        prepared branch that may still add messages."""
        return self.open_sequences == 0 and self.unacked == 0 and self.prepared == 0

    def line(self) -> str:
        return (f"sent {self.sent} (+{self.retransmissions} retransmissions); unacked "
                f"{self.unacked}; open sequences {self.open_sequences}; prepared branches "
                f"{self.prepared}")


class Sender:
    """A :class:`ReliableEngine` with no application: only its RM Source workers matter."""

    def __init__(self, store: str | StorageManager, policy: RMPolicy | None = None) -> None:
        self.policy = policy or RMPolicy(soap_version=SOAP11)
        self._owns_store = isinstance(store, str)
        if isinstance(store, str):
            # one pooled session per request in flight plus the workers' own; a smaller pool
            # closes and reopens sessions all the time (a PostgreSQL backend fork each)
            in_flight = self.policy.most_requests_in_flight
            sized: dict[str, Any] = {} if "pool_size=" in store else {"pool_size": in_flight + 4}
            store = open_store(store, **sized)
        self.store = store
        self.engine = ReliableEngine(self.store, self.policy, name="wsrm-sender")

    def start(self) -> "Sender":
        self.engine.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.engine.stop(timeout)
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "Sender":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def progress(self) -> SenderProgress:
        """Counts only (cheap: no payloads are read, unlike ``store.status()``)."""
        with self.store.begin() as tx:
            sequences = len(tx.rms.list_all())
            unacked = tx.rms_messages.count_unacked()
        prepared = len(self.store.xa_resource().recover())
        retransmission = self.engine.retransmission
        return SenderProgress(sequences, unacked, prepared, retransmission.messages_sent,
                              retransmission.retransmissions)

    def wait_until_idle(self, timeout: float | None = None, *, report_every: float = 0.0,
                        out: IO[str] | None = None, stop: threading.Event | None = None) -> bool:
        """Wait until :attr:`SenderProgress.idle`; False when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last_report = time.monotonic()
        while True:
            progress = self.progress()
            if report_every and time.monotonic() - last_report >= report_every:
                last_report = time.monotonic()
                _report(progress, out)
            if progress.idle:
                return True
            if (deadline is not None and time.monotonic() > deadline) or (stop and stop.is_set()):
                return False
            time.sleep(0.2)


def _report(progress: SenderProgress, out: IO[str] | None) -> None:
    if out is not None:
        print(progress.line(), file=out, flush=True)
    log.info("%s", progress.line())


def run_sender(store: str, *, policy: RMPolicy | None = None, until_acked: bool = False,
               timeout: float | None = None, report_every: float = 5.0,
               out: IO[str] | None = sys.stderr) -> int:
    """Run the sender; with ``until_acked`` return once everything is delivered.

    Returns 0 when done (or stopped by Ctrl-C without ``until_acked``), 1 when
    ``timeout`` passed with messages still undelivered.
    """
    with Sender(store, policy) as sender:
        try:
            if until_acked:
                done = sender.wait_until_idle(timeout, report_every=report_every, out=out)
                _report(sender.progress(), out)
                return 0 if done else 1
            deadline = None if timeout is None else time.monotonic() + timeout
            while deadline is None or time.monotonic() < deadline:
                time.sleep(report_every or 5.0)
                _report(sender.progress(), out)
            return 0
        except KeyboardInterrupt:
            return 0


def add_arguments(parser: Any) -> None:
    parser.add_argument("--store", required=True, help="the shared message store (postgresql://...)")
    parser.add_argument("--until-acked", action="store_true",
                        help="exit (0) once every message is acknowledged and every sequence ended")
    parser.add_argument("--timeout", type=float, default=None,
                        help="give up after this many seconds (exit 1 if messages are left)")
    parser.add_argument("--report-every", type=float, default=5.0, help="seconds between status lines")
    parser.add_argument("--soap-version", default="1.1", choices=("1.1", "1.2"),
                        help="SOAP version of the protocol messages (match the service)")
    parser.add_argument("--retransmission-interval", type=float, default=None,
                        help="base retransmission interval in seconds")
    parser.add_argument("--send-concurrency", type=int, default=None,
                        help="messages in flight at once, at most (default: one per sequence with messages "
                             "due, up to %d); each waits for the service's durable receive, so this, not CPU, "
                             "bounds a sender" % RMPolicy().most_requests_in_flight)
    parser.add_argument("--send-batch", type=int, default=None,
                        help="due messages claimed per store transaction (default %d)" % RMPolicy.send_batch)


def run(args: Any) -> int:
    extra: dict[str, Any] = {}
    if args.retransmission_interval:
        extra["base_retransmission_interval"] = args.retransmission_interval
    if args.send_concurrency:
        extra["send_concurrency"] = args.send_concurrency
    if args.send_batch:
        extra["send_batch"] = args.send_batch
    return run_sender(args.store, policy=RMPolicy(soap_version=args.soap_version, **extra),
                      until_acked=args.until_acked, timeout=args.timeout,
                      report_every=args.report_every)

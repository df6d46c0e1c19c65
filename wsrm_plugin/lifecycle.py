"""The lifecycle listener (seed 004, 3.4.4): what a node does on start-up before it works again.

After a crash the store holds in-flight sequences, messages and maybe
prepared XA branches.  Order matters:

1. **Transaction recovery first.**  A branch the store prepared for a
   transaction that committed must be committed before anything reads the
   store, or the workers would see (and resend, or drop) a half-finished
   state.  The store's XA resource is registered with the transaction manager
   and one recovery pass runs over it and every resource registered before
   (the user's databases).
2. **Restore the persisted callbacks.**  In-out messages waiting for a reply
   carry import paths (``reply_callback``, and the zeep client's own in its
   reply context); they are imported now so a missing module is reported at
   start-up, not when the reply arrives hours later.
3. **Resume** the in-flight sequences: their unacknowledged messages are made
   due at once instead of waiting out a backoff computed before the crash.
4. **Terminate orphans**: source sequences whose owner key is no longer in
   use (``active_keys``) or whose expiry passed are closed and terminated.

Listeners learn the outcome through the pluggy hook
``wsrm_lifecycle_started(engine, report)`` (:mod:`interceptors.hookspecs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .engine import ReliableEngine
from .engine.source import SequenceKey
from .store.api.states import rms_life

__all__ = ["LifecycleListener", "LifecycleReport", "check_recovery_interval"]

log = logging.getLogger(__name__)


def check_recovery_interval(interval: float | None, tm: Any) -> None:
    """Refuse a ``recovery_interval`` that cannot work, when the client or service is built."""
    if interval is not None and not interval > 0:
        raise ValueError(f"recovery_interval must be > 0 seconds or None, not {interval!r}")
    if interval is not None and tm is None:
        raise ValueError("recovery_interval needs a transaction manager (tm=...): without one "
                         "there are no transactions to recover")


@dataclass
class LifecycleReport:
    """What the start-up pass found and did."""

    recovery: Any = None  # txmanager.RecoveryReport, when a transaction manager was given
    callbacks_restored: list[str] = field(default_factory=list)
    callbacks_missing: dict[str, str] = field(default_factory=dict)  # path -> why it cannot be imported
    replies_pending: int = 0
    resumed_sequences: list[str] = field(default_factory=list)
    resumed_messages: int = 0
    orphans_terminated: list[str] = field(default_factory=list)

    def summary(self) -> str:
        recovery = self.recovery.summary() if self.recovery is not None else "no transaction manager"
        return (f"recovery: {recovery}; callbacks: {len(self.callbacks_restored)} restored, "
                f"{len(self.callbacks_missing)} missing; {self.replies_pending} replies pending; "
                f"{len(self.resumed_sequences)} sequences resumed ({self.resumed_messages} messages); "
                f"{len(self.orphans_terminated)} orphaned sequences terminated")


class LifecycleListener:
    """Runs the start-up pass for ``engine`` (call :meth:`on_start` before ``engine.start()``).

    ``tm`` is the node's ``txmanager.TransactionManager`` (recovery needs it);
    ``active_keys`` are the sequence owner keys still in use (None: no
    orphan detection by key, e.g. on a server); ``hooks`` is a pluggy hook
    relay (``chain.plugins.hook``) to announce the report on.
    """

    def __init__(self, engine: ReliableEngine, *, tm: Any = None, active_keys: Iterable[str] | None = None,
                 hooks: Any = None) -> None:
        self.engine = engine
        self.tm = tm
        self.active_keys = set(active_keys) if active_keys is not None else None
        self.hooks = hooks
        self._runs_recovery = False

    # -- background recovery ------------------------------------------------------------------

    def start_recovery(self, interval: float | None, report: LifecycleReport | None = None) -> None:
        """Keep the manager's recovery running every ``interval`` seconds (None: only at start-up).

        A branch a killed process left prepared blocks the rows it wrote until
        something decides it; the start-up pass rolls it back only once it is
        older than the manager's safety interval.  Without a background pass
        such a branch waits for the next restart, so that case is logged as a
        WARNING naming the option that fixes it.
        """
        if self.tm is None or self._runs_recovery:
            return
        waiting = len(report.recovery.waiting) if report is not None and report.recovery is not None else 0
        if interval is None:
            if waiting:
                log.warning("%s: %d prepared branch(es) of this node are younger than the transaction "
                            "manager's safety interval; without background recovery they stay prepared "
                            "(holding their locks) until the next start: pass recovery_interval=<seconds>",
                            self.engine.name, waiting)
            return
        if self.tm.recovery.running:
            log.info("the transaction manager's recovery already runs in the background")
            return
        self.tm.recovery.start(interval)
        self._runs_recovery = True

    def stop_recovery(self, timeout: float = 10.0) -> None:
        """Stop the background recovery :meth:`start_recovery` started (if it did)."""
        if self._runs_recovery:
            self.tm.recovery.stop(timeout)
            self._runs_recovery = False

    def on_start(self) -> LifecycleReport:
        report = LifecycleReport()
        if self.tm is not None:
            self.tm.register_resource(self.engine.store.xa_resource())
            report.recovery = self.tm.recovery.recover_once()
            log.info("start-up recovery: %s", report.recovery.summary())
        self._restore_callbacks(report)
        self._resume_and_terminate(report)
        log.info("lifecycle start-up of %s: %s", self.engine.name, report.summary())
        if self.hooks is not None and hasattr(self.hooks, "wsrm_lifecycle_started"):
            self.hooks.wsrm_lifecycle_started(engine=self.engine, report=report)
        return report

    def _restore_callbacks(self, report: LifecycleReport) -> None:
        from interceptors.zeep_client.reliable import DISPATCH_PATH, decode_reply_context, import_callback

        paths: set[str] = set()
        with self.engine.store.begin() as tx:
            for seq in tx.rms.list_all():
                for msg in tx.rms_messages.list_for(seq.key):
                    if not msg.reply_callback or not (msg.reply_pending or not msg.acked):
                        continue
                    report.replies_pending += 1
                    paths.add(msg.reply_callback)
                    if msg.reply_callback == DISPATCH_PATH:
                        try:
                            user = decode_reply_context(msg.reply_context).get("callback")
                        except ValueError as exc:
                            report.callbacks_missing[f"{seq.key}#{msg.number}"] = str(exc)
                            continue
                        if user:
                            paths.add(user)
        for path in sorted(paths):
            try:
                import_callback(path)
            except Exception as exc:  # noqa: BLE001 -- reported, and the delivery will report again
                report.callbacks_missing[path] = f"{type(exc).__name__}: {exc}"
                log.error("reply callback %s cannot be imported (%s): replies for it will fail", path, exc)
            else:
                report.callbacks_restored.append(path)

    def _resume_and_terminate(self, report: LifecycleReport) -> None:
        now = time.time()
        orphans: list[tuple[str, str, str]] = []
        with self.engine.store.begin() as tx:
            for seq in tx.rms.list_all():
                if seq.faulted:
                    continue  # the RMS worker reports and releases it
                parsed = SequenceKey.decode(seq.key)
                expired = seq.expires is not None and seq.expires < now
                if parsed is not None and (expired or (self.active_keys is not None
                                                       and parsed.key not in self.active_keys)):
                    if rms_life(seq).accepts_messages:
                        orphans.append((seq.key, parsed.target, parsed.key))
                    continue
                if not seq.started:
                    continue  # CreateSequence is (re)sent by the worker anyway
                unacked = [m.number for m in tx.rms_messages.list_for(seq.key) if not m.acked]
                if unacked:
                    tx.rms_messages.make_due(seq.key, unacked, at=now)
                    report.resumed_sequences.append(seq.key)
                    report.resumed_messages += len(unacked)
        for store_key, target, key in orphans:
            if self.engine.close(target, key):
                report.orphans_terminated.append(store_key)
                log.warning("terminating orphaned sequence %s (owner key %r no longer in use or expired)",
                            store_key, key)

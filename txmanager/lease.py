"""A node name held by a live PostgreSQL session: the claim several hosts agree on.

:class:`~txmanager.slots.NodeSlots` names the processes of ONE host with file
locks the kernel drops when a process dies.  Hosts share no kernel, but they
share the store's database, and PostgreSQL has the same thing: a
session-level advisory lock is held exactly as long as the session that took
it, and released by the server when that session ends -- at once when the
host's process dies (its kernel closes the socket), within the TCP keepalive
bound when the whole host or its network goes (see :class:`Timing`).  No
lease to renew, no clock shared between hosts.

A claim is three things in the database (created on first use):

``txm_node``
    one row per node name ever claimed: its ``id`` (the advisory lock key,
    with :data:`LOCK_CLASS`), its ``epoch`` and who holds it.
``txm_fence(node, epoch)``
    a function that takes the node's fence lock shared for the rest of the
    transaction (an advisory lock: no row is written), then fails (SQLSTATE
    :data:`FENCED`) unless ``epoch`` is still the row's: every decision this
    node writes calls it in the same transaction (a commit mark, a row of
    :class:`~txmanager.dblog.DatabaseLog`).  In a transaction whose snapshot
    is not per statement (REPEATABLE READ and up) it share-locks the row
    instead.
the advisory lock ``(LOCK_CLASS, id)``
    held by the dedicated :class:`LeaseSession` of the holder.

Taking a name over (:func:`seize`) is: get the lock (only possible once the
old holder's session is gone), end the old holder's other sessions still on
the server (tagged with its ``application_name``), raise the epoch, then take
the fence lock exclusively (and let it go).  A decision of the old holder
that took the fence lock before that is waited for (and then read by
recovery); one that takes it after reads the new epoch and fails: the fence.
So after :func:`seize` returns, the set of decisions of the node is final,
and its recovery may commit what was decided and roll back the rest with no
safety interval and no guess.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg2
from psycopg2 import extensions as ext

__all__ = ["LOCK_CLASS", "FENCE_CLASS", "FENCED", "SCHEMA", "Timing", "LeaseSession", "NodeClaim", "Fence",
           "LeaseLostError", "seize", "session_tag", "ensure_schema"]

log = logging.getLogger(__name__)

#: First half of every node's advisory lock key ("WS31"): the second half is ``txm_node.id``.
LOCK_CLASS = 0x57533331
#: SQLSTATE of a decision refused because the node was taken over.
FENCED = "WX001"
#: First half of the key of a node's fence lock ("WS32"): shared by each decision in flight,
#: taken exclusively by a takeover once it raised the epoch (see :func:`txm_fence <seize>`).
FENCE_CLASS = 0x57533332
#: Serialises the creation of the tables between hosts starting at once.
_SCHEMA_LOCK = 0x74786D6E6F6465  # "txmnode"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS txm_node (
    id serial PRIMARY KEY,
    name text NOT NULL UNIQUE,
    epoch bigint NOT NULL DEFAULT 0,
    holder text,
    claimed_at timestamptz
);
CREATE TABLE IF NOT EXISTS txm_decision (
    node text NOT NULL,
    gtrid text NOT NULL,
    kind text NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (node, gtrid, kind)
);
CREATE OR REPLACE FUNCTION txm_fence(p_node text, p_epoch bigint) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id integer;
    v_epoch bigint;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- the shared lock first, then the epoch in a snapshot taken after it (each statement of a
        -- volatile function takes its own): a takeover raises the epoch, then waits for this lock
        SELECT id INTO v_id FROM txm_node WHERE name = p_node;
        IF v_id IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock_shared({FENCE_CLASS}, v_id);
            SELECT epoch INTO v_epoch FROM txm_node WHERE id = v_id;
        END IF;
    ELSE
        -- one snapshot for the whole transaction: lock the row instead (a takeover's update
        -- waits for it; one committed since the snapshot fails this transaction)
        SELECT epoch INTO v_epoch FROM txm_node WHERE name = p_node FOR SHARE;
    END IF;
    IF v_epoch IS DISTINCT FROM p_epoch THEN
        RAISE EXCEPTION 'node % was taken over by another host (claim epoch % is no longer current): '
                        'this process can decide nothing for it any more; restart it', p_node, p_epoch
              USING ERRCODE = '{FENCED}';
    END IF;
    RETURN p_node;
END $$;
"""

T = TypeVar("T")


class LeaseLostError(RuntimeError):
    """The session that held a node's claim is gone: this process may no longer decide for it."""


@dataclass(frozen=True)
class Timing:
    """How fast a dead holder's claim frees up, derived from one bound (seconds).

    ``takeover_within`` is the time from a host's death to its transactions
    being resolved by another host (its locks released).  It is spent on:

    * the server noticing the holder's session is dead.  A killed process:
      at once (its kernel closes the connection).  A lost host or network:
      TCP keepalive, set on the lease session on the server's side
      (``tcp_keepalives_idle`` + ``tcp_keepalives_count`` x
      ``tcp_keepalives_interval``, and ``tcp_user_timeout`` for data sent and
      not acknowledged), 60% of the bound;
    * a watcher noticing the free claim: every ``watch_interval`` (10%);
    * its recovery pass (the rest: a few queries per database).

    The client side of the lease session gets the same keepalive settings,
    so the holder learns it lost its claim in about the same time.
    """

    takeover_within: float = 10.0

    def __post_init__(self) -> None:
        if not self.takeover_within >= 3:
            raise ValueError(f"takeover_within must be >= 3 seconds (TCP keepalive counts whole "
                             f"seconds), not {self.takeover_within!r}")

    @property
    def keepalive_idle(self) -> int:
        return max(1, int(self.takeover_within * 0.3))

    @property
    def keepalive_interval(self) -> int:
        return max(1, int(self.takeover_within * 0.1))

    @property
    def keepalive_count(self) -> int:
        return 3

    @property
    def user_timeout_ms(self) -> int:
        return int(self.takeover_within * 600)

    @property
    def dead_after(self) -> float:
        """Seconds after which the server drops a silent holder's session (keepalive)."""
        return self.keepalive_idle + self.keepalive_count * self.keepalive_interval

    @property
    def watch_interval(self) -> float:
        return max(0.2, self.takeover_within * 0.1)

    def connect_kwargs(self) -> dict[str, Any]:
        """libpq parameters for a session whose death must be noticed within the bound."""
        server = (f"-c tcp_keepalives_idle={self.keepalive_idle} "
                  f"-c tcp_keepalives_interval={self.keepalive_interval} "
                  f"-c tcp_keepalives_count={self.keepalive_count} "
                  f"-c tcp_user_timeout={self.user_timeout_ms}")
        return {"keepalives": 1, "keepalives_idle": self.keepalive_idle,
                "keepalives_interval": self.keepalive_interval, "keepalives_count": self.keepalive_count,
                "tcp_user_timeout": self.user_timeout_ms, "connect_timeout": max(2, int(self.takeover_within)),
                "options": server}


def session_tag(node: str) -> str:
    """The ``application_name`` of the sessions of ``node``'s holder (ended when it is taken over)."""
    return f"txm:{node}"


@dataclass(frozen=True)
class Fence:
    """What a decision of this node checks in its own transaction: ``txm_fence(node, epoch)``.

    ``database`` names the database holding ``txm_node`` (as
    :func:`txmanager.postgres.default_resource_name` does): only a commit mark
    written there can be fenced, so only a resource of that database carries
    marks for a leased node."""

    node: str
    epoch: int
    database: str


class LeaseSession:
    """The dedicated connection that holds claims, with the keepalive of :class:`Timing`.

    One connection, used by one thread at a time (:meth:`run`).  Once it
    failed it is :attr:`lost` for good: its claims may already be someone
    else's, so it is never silently reconnected.
    """

    def __init__(self, dsn: str, timing: Timing, *, tag: str = "txm:lease") -> None:
        self.dsn = dsn
        self.timing = timing
        self._lock = threading.RLock()
        self.lost: BaseException | None = None
        kwargs = timing.connect_kwargs()
        options = ext.parse_dsn(dsn).get("options", "")
        kwargs["options"] = f"{options} {kwargs['options']}".strip()
        self.conn = psycopg2.connect(dsn, application_name=tag, **kwargs)
        self.conn.autocommit = True
        self.backend_pid: int = self.conn.info.backend_pid
        ensure_schema(self.conn)

    def run(self, work: Callable[[Any], T]) -> T:
        """``work(cursor)`` on the session (autocommit unless ``work`` opens a transaction)."""
        with self._lock:
            if self.lost is not None:
                raise LeaseLostError(f"the lease session to {_where(self.dsn)} was lost ({self.lost}): "
                                     "its claims may belong to another host now") from self.lost
            try:
                with self.conn.cursor() as cur:
                    return work(cur)
            except psycopg2.Error as exc:
                if self.conn.closed or isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
                    self.lost = exc
                    with contextlib.suppress(psycopg2.Error):
                        self.conn.close()
                    raise LeaseLostError(f"the lease session to {_where(self.dsn)} failed: {exc}") from exc
                raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor in one transaction on the session (committed at the end, rolled back on error)."""
        with self._lock:
            def begin(cur: Any) -> Any:
                cur.execute("BEGIN")
                return cur
            self.run(begin)
            try:
                yield _Cursor(self)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.run(lambda cur: cur.execute("ROLLBACK"))
                raise
            self.run(lambda cur: cur.execute("COMMIT"))

    def alive(self) -> bool:
        """One round trip; False (and :attr:`lost`) when the session is gone."""
        try:
            self.run(lambda cur: cur.execute("SELECT 1"))
        except LeaseLostError:
            return False
        return True

    def close(self) -> None:
        """End the session: the server releases every claim it held."""
        with self._lock:
            if self.lost is None:
                self.lost = LeaseLostError("closed")
            with contextlib.suppress(psycopg2.Error):
                self.conn.close()


class _Cursor:
    """Statements of :meth:`LeaseSession.transaction`, each through :meth:`LeaseSession.run`."""

    def __init__(self, session: LeaseSession) -> None:
        self._session = session

    def execute(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        def go(cur: Any) -> list[tuple[Any, ...]]:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
        return self._session.run(go)


@dataclass
class NodeClaim:
    """A node name whose advisory lock ``session`` holds, at ``epoch``."""

    session: LeaseSession
    node: str
    node_id: int
    epoch: int
    database: str

    @property
    def fence(self) -> Fence:
        return Fence(self.node, self.epoch, self.database)

    def release(self) -> None:
        """Give the name back (the session stays open for its other claims)."""
        self.session.run(lambda cur: cur.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, self.node_id)))


def ensure_schema(conn: Any) -> None:
    """Create the claim tables and the fence function if they are missing (serialised between hosts)."""
    autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('txm_node') IS NOT NULL AND to_regclass('txm_decision') IS NOT NULL "
                        "AND to_regprocedure('txm_fence(text,bigint)') IS NOT NULL")
            if not cur.fetchone()[0]:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                cur.execute(SCHEMA)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = autocommit


def try_lock(session: LeaseSession, node: str, *, create: bool) -> int | None:
    """The id of ``node`` when ``session`` got its advisory lock now, else None.

    ``create`` adds the name when it is new (then the lock is free)."""
    def go(cur: Any) -> int | None:
        if create:
            cur.execute("INSERT INTO txm_node (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (node,))
        cur.execute("SELECT id FROM txm_node WHERE name = %s", (node,))
        row = cur.fetchone()
        if row is None:
            return None
        cur.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, row[0]))
        return int(row[0]) if cur.fetchone()[0] else None
    return session.run(go)


def seize(session: LeaseSession, node: str, node_id: int, database: str, holder: str | None = None) -> NodeClaim:
    """Make the claim on ``node`` (its lock already held by ``session``) the only one that can decide.

    Ends the sessions the previous holder left on the server (a host cut off
    from the database still has them, with their row locks), then raises the
    epoch: see the module docstring."""
    def go(cur: Any) -> int:
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND pid <> pg_backend_pid()", (session_tag(node),))
        ended = sum(1 for (ok,) in cur.fetchall() if ok)
        if ended:
            log.warning("node %s: ended %d session(s) its previous holder left on the server", node, ended)
        cur.execute("UPDATE txm_node SET epoch = epoch + 1, holder = %s, claimed_at = now() "
                    "WHERE id = %s RETURNING epoch", (holder or describe_holder(), node_id))
        epoch = int(cur.fetchone()[0])
        # committed (autocommit): every decision that starts from now on sees the new epoch;
        # the ones in flight hold the fence lock shared until they end, so wait for them
        cur.execute("SELECT pg_advisory_lock(%s, %s)", (FENCE_CLASS, node_id))
        cur.execute("SELECT pg_advisory_unlock(%s, %s)", (FENCE_CLASS, node_id))
        return epoch
    epoch = session.run(go)
    return NodeClaim(session, node, node_id, epoch, database)


def describe_holder() -> str:
    """Who holds a claim, for people reading ``txm_node``: host and process."""
    return f"{socket.gethostname()} pid {os.getpid()}"


def _where(dsn: str) -> str:
    params = ext.parse_dsn(dsn)
    return f"{params.get('dbname', '?')}@{params.get('host', 'localhost')}:{params.get('port', 5432)}"

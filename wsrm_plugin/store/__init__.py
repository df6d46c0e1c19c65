"""WS-RM message stores: where sequences and messages live (seed 004, 3.4.3).

``open_store(url)`` picks the store:

``memory:``
    in this process only; fast; a volatile XA participant (:mod:`.memory`);
``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
    the embedded durable default; one writer at a time; durable XA prepare
    with undo records (:mod:`.sqlite`);
``postgresql://user@host:port/db`` (or ``postgres://``, or a libpq
``key=value`` DSN prefixed with ``postgresql:``)
    row locks and SKIP LOCKED pollers for many workers and processes; XA
    through PostgreSQL prepared transactions (:mod:`.postgres`).

Options go in the query string: ``?lock_timeout=5`` (seconds a transaction
waits for a lock), ``pool_size=8`` (sessions kept idle; PostgreSQL keeps more while its load
needs more at once, up to the most it had out lately); PostgreSQL also ``prepare_statements=0``
(every statement sent as text: behind a pooler in transaction mode, see
:mod:`.prepared`) and ``commit_marks=0`` (by default a transaction with a branch
in another database commits the store's branch last, in one phase, with its
decision, instead of preparing it and writing the recovery log:
:mod:`txmanager.marks`; 0 prepares it like any other branch).
The API every store offers is in :mod:`.api`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from .api import (
    BufferedMessage, CommitDeclined, PoisonMessage, DuplicateSequenceError, InDoubtBranchesError,
    InvalidAcknowledgementError, InvokerSequence, LockOrderError, LockTimeoutError, MessageNumberRolloverError,
    NodeCondition, RmdSequence, RmsMessage, RmsSequence, SchemaVersionError, SequenceNotOpenError, StorageManager,
    StoreClosedError, StoreError, StoreNotFoundError, StoreStatus, StoreTransaction, StoreUnavailableError,
    TransactionClosedError, UnknownMessageError, UnknownSequenceError,
)

__all__ = [
    "open_store", "StorageManager", "StoreTransaction", "StoreStatus",
    "RmsSequence", "RmsMessage", "RmdSequence", "BufferedMessage", "InvokerSequence", "PoisonMessage",
    "NodeCondition", "StoreError", "DuplicateSequenceError", "UnknownSequenceError", "UnknownMessageError",
    "InvalidAcknowledgementError", "MessageNumberRolloverError", "SequenceNotOpenError",
    "LockOrderError", "LockTimeoutError", "InDoubtBranchesError", "TransactionClosedError",
    "StoreClosedError", "SchemaVersionError", "StoreUnavailableError", "StoreNotFoundError", "CommitDeclined",
]

def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


_OPTIONS: dict[str, Any] = {"lock_timeout": float, "pool_size": int}
#: PostgreSQL only: server-side prepared statements (off behind a transaction-mode pooler)
#: and commit marks (the decision of a transaction with other branches kept in the store's
#: database, see txmanager.marks)
_PG_OPTIONS: dict[str, Any] = {"prepare_statements": _flag, "commit_marks": _flag}
#: SQLite only: zero what a delivered message leaves in the file (see SqliteStore)
_SQLITE_OPTIONS: dict[str, Any] = {"secure_delete": _flag}


def _options(query: str, url: str, known: dict[str, Any] = _OPTIONS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in known:
            raise ValueError(f"unknown store option {name!r} in {url!r}; known: {sorted(known)}")
        try:
            out[name] = known[name](value)
        except ValueError:
            what = "0 or 1" if known[name] is _flag else "a number"
            raise ValueError(f"store option {name}={value!r} in {url!r} is not {what}") from None
    return out


def open_store(url: str, *, create: bool = True, **options: Any) -> StorageManager:
    """Open (and migrate, for SQL) the store ``url`` names; keyword options override the URL's.

    ``create=False`` (the operator commands) raises :class:`StoreNotFoundError` instead of
    creating a store that is not there, and refuses ``memory:``, which lives only inside the
    process that opened it: either would answer "no sequences, all fine" to a mistyped URL."""
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a string, not {type(url).__name__}")
    scheme, _, rest = url.partition(":")
    scheme = scheme.lower()
    if scheme == "memory" and not create:
        raise StoreNotFoundError(
            f"{url!r} is a memory store: it lives inside the process that uses it, so this one would "
            "see an empty store; give the service's sqlite:/// or postgresql:// store URL")
    if scheme == "memory":
        from .memory import MemoryStore
        name, _, query = rest.partition("?")
        opts = {**_options(query, url), **options}
        opts.pop("pool_size", None)
        return MemoryStore(name=name or "memory", **opts)
    if scheme == "sqlite":
        from .sqlite import SqliteStore
        parts = urlsplit(url)
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise ValueError(
                f"SQLite store URL {url!r} must look like sqlite:///relative/file.db or "
                "sqlite:////absolute/file.db")
        return SqliteStore(parts.path[1:], create=create,
                           **{**_options(parts.query, url, {**_OPTIONS, **_SQLITE_OPTIONS}), **options})
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresStore
        if rest.startswith("//"):
            parts = urlsplit(url)
            pairs = parse_qsl(parts.query, keep_blank_values=True)
            known = {**_OPTIONS, **_PG_OPTIONS}
            ours = {k: v for k, v in pairs if k in known}
            libpq = "&".join(f"{k}={v}" for k, v in pairs if k not in known)
            dsn = urlunsplit(("postgresql", parts.netloc, parts.path, libpq, ""))
            opts = _options("&".join(f"{k}={v}" for k, v in ours.items()), url, known)
        else:
            dsn, opts = rest.strip(), {}
        return PostgresStore(dsn, create=create, **{**opts, **options})
    raise ValueError(
        f"unsupported store URL {url!r}: use memory:, sqlite:///path.db or postgresql://...")

"""The one-phase path's usual case in C, when its extension was built (``txmanager/_onephase.c``).

A one-phase transaction on a warm pool (``with ds.transaction() as conn``, or ``with
tm.transaction(): with ds.connection() as conn``), its first statement and its COMMIT cost a
few hundred bytecodes of bookkeeping above plain psycopg2; at about 26 machine instructions
each, no Python form of them fits issue 33's 10 us a transaction.  The extension runs exactly
that usual case in C, as the Python code singles it out: the blocks (made, entered: a
transaction begun, a pooled session started; left: the one-phase COMMIT, the session back in
its pool), the session's ``cursor()`` and the lazy ``BEGIN`` riding on the first ``execute``.
Anything else (a check that fails, an error after the COMMIT was sent) runs the Python
methods, which stay the reference: the C code calls them.

It is optional, as psycopg's or msgspec's C parts are: when the extension is missing (not
built, no compiler at install) or refuses the classes it is given, the Python path runs, the
same.  ``TXMANAGER_PURE_PYTHON=1`` in the environment keeps the Python path.  Which one runs is
logged at DEBUG when :mod:`txmanager.postgres` is imported; :func:`enabled` tells, and
:func:`use` switches (the tests run the one-phase path both ways).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import psycopg2
import psycopg2.extensions as ext

from .. import lazy_begin
from .. import manager as _manager
from .. import transaction as _transaction
from . import datasource
from .branch import _Branch
from .resource import _B_ACTIVE, _B_IDLE, PostgresXAResource

__all__ = ["available", "enabled", "use"]

log = logging.getLogger(__name__)

_TM = _manager.TransactionManager
_DS = datasource.XADataSource
_LBC = lazy_begin.LazyBeginConnection
_LBCUR = lazy_begin.LazyBeginCursor

#: what Python defines, by what setup() calls the C twin; put back by ``use(False)``
_PYTHON: dict[str, Any] = {
    "TransactionConnectionScope": datasource._TransactionConnectionScope,
    "TransactionScope": _manager._TransactionScope, "ConnectionScope": datasource._ConnectionScope,
    "tm_transaction": _TM.transaction, "transaction": _DS.transaction, "connection": _DS.connection,
    "cursor": _LBC.cursor, "execute": _LBCUR.execute}
_made: dict[str, Any] | None = None  # the C classes and methods, once setup() took ours
_why_not: str | None = None


def _load() -> dict[str, Any] | None:
    """The extension, given the classes it reads and the Python it falls back to (once)."""
    global _made, _why_not
    if _made is not None or _why_not is not None:
        return _made
    try:
        from .. import _onephase  # type: ignore[attr-defined]
        _made = _onephase.setup({
            "_OnePhase": _transaction._OnePhase, "Transaction": _transaction.Transaction,
            "_Settings": _transaction._Settings, "LazyBeginConnection": _LBC, "LazyBeginCursor": _LBCUR,
            "_Branch": _Branch, "_SessionReturn": datasource._SessionReturn,
            "PostgresXAResource": PostgresXAResource, "XADataSource": _DS, "TransactionManager": _TM,
            "_PENDING": lazy_begin._PENDING, "_SQL": lazy_begin._SQL, "_B_ACTIVE": _B_ACTIVE, "_B_IDLE": _B_IDLE,
            "_ACTIVE": _transaction._ACTIVE, "_COMMITTING": _transaction._COMMITTING,
            "_COMMITTED": _transaction._COMMITTED, "Error": psycopg2.Error,
            "TRANSACTION_STATUS_INERROR": ext.TRANSACTION_STATUS_INERROR,
            "monotonic": _transaction._monotonic,
            "py_enter": datasource._TransactionConnectionScope.__enter__,
            "py_tx_enter": _manager._TransactionScope.__enter__,
            "py_tx_call": _manager._TransactionScope.__call__,
            "py_conn_enter": datasource._ConnectionScope.__enter__,
            "py_conn_exit": datasource._ConnectionScope.__exit__,
            "exit": _manager._TransactionScope.__exit__,
            "py_tm_transaction": _PYTHON["tm_transaction"], "py_transaction": _PYTHON["transaction"],
            "py_connection": _PYTHON["connection"], "py_cursor": _PYTHON["cursor"], "py_execute": _PYTHON["execute"],
            "pg_cursor": ext.connection.cursor, "pg_status": ext.connection.get_transaction_status,
            "pg_execute": ext.cursor.execute, "cursor": ext.cursor,
            "begin_refused": _LBC._begin_refused,
            "commit_failed": PostgresXAResource._one_phase_commit_failed,
            "fused_failed": _transaction._OnePhase._fused_failed,
            "raise_commit_refused": lazy_begin.raise_commit_refused,
        })
    except Exception as e:  # noqa: BLE001 -- not built, or built for other classes: Python runs
        _why_not = f"{type(e).__name__}: {e}"
    return _made


def available() -> bool:
    """True when the C one-phase path can run (built and set up), whether in use or not."""
    return _load() is not None


def enabled() -> bool:
    """True while the C one-phase path runs."""
    return datasource._scope_class is not _PYTHON["TransactionConnectionScope"]


def use(c: bool) -> bool:
    """Run the one-phase path in C (``c`` True, when :func:`available`) or in Python; True
    when C runs now.  Switch between transactions, not during one."""
    made = _load() if c else None
    chosen = made if made is not None else _PYTHON
    datasource._scope_class = chosen["TransactionConnectionScope"]
    _TM.transaction = chosen["tm_transaction"]  # type: ignore[method-assign]
    _DS.transaction = chosen["transaction"]  # type: ignore[method-assign]
    _DS.connection = chosen["connection"]  # type: ignore[method-assign]
    _LBC.cursor = chosen["cursor"]  # type: ignore[method-assign]
    _LBCUR.execute = chosen["execute"]  # type: ignore[method-assign]
    return made is not None


def install() -> None:
    """At import: C unless ``TXMANAGER_PURE_PYTHON=1`` or it cannot run (logged at DEBUG)."""
    if os.environ.get("TXMANAGER_PURE_PYTHON") == "1":
        log.debug("one-phase path: Python (TXMANAGER_PURE_PYTHON=1)")
        return
    if use(True):
        log.debug("one-phase path: C (txmanager._onephase)")
    else:
        log.debug("one-phase path: Python (the C extension cannot run: %s)", _why_not)

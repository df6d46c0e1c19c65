"""The SQL logic both SQL stores share (SQLite and PostgreSQL).

Every statement is written once, with ``?`` placeholders and the row locks
spelled through a :class:`Dialect`; what differs between the two databases is
confined there: placeholder style, column types (blob, bigint, boolean,
double), ``FOR UPDATE`` / ``SKIP LOCKED`` (SQLite has neither: the SQLite store
serializes whole transactions instead, see :mod:`.sqlite`).  Upserts use
``INSERT ... ON CONFLICT DO NOTHING``, which both understand.

The tables follow seed 004's database design (one set of tables per manager,
touched in the lock order RMD, invoker buffer, RMS):

``rms_sequence`` / ``rms_message``
    source sequences and their retransmission queue;
``rmd_sequence``
    destination sequences, received numbers kept as compact ranges text;
``invoker_sequence`` / ``invoker_message``
    what was delivered (ranges, plus the in-order prefix so a poller finds the
    next deliverable message in SQL) and what waits to be, with each waiting
    message's delivery history (failed attempts, retry cycle, next attempt);
``poison_message``
    messages given up after their last retry cycle, kept until an operator
    retries or discards them (schema version 3);
``node_condition``
    what engine processes report about what they depend on, such as a peer
    they cannot reach (schema version 4);
``schema_version``
    one row per applied migration; a store is migrated when it is opened.

For the SQLite store's XA support a transaction can also *capture undo*:
before any write, the before-image of every row it touches (or "did not
exist") is kept, keyed by table and primary key; see :class:`SqlTransaction`.

The package's modules follow those lines: :mod:`.dialect`, :mod:`.schema`,
:mod:`.rows` (rows to records), :mod:`.transaction`, one module of statements
per manager (:mod:`.rms`, :mod:`.rmd`, :mod:`.invoker`; :mod:`.statements` for
the one statement that spans the RMD and invoker tables) and :mod:`.undo`.
"""

from __future__ import annotations

from ..api import ManagerOnFirstUse
from .conditions import _Conditions
from .dialect import POSTGRES, SQLITE, Dialect
from .invoker import _Invoker
from .rmd import _Rmd, foresee_in_order
from .rms import _Rms, _RmsMessages
from .schema import LATEST_VERSION, MIGRATIONS, migrate
from .transaction import SqlTransaction, apply_undo
from .undo import decode_undo, encode_undo

__all__ = ["Dialect", "SQLITE", "POSTGRES", "SqlTransaction", "migrate", "LATEST_VERSION", "MIGRATIONS",
           "encode_undo", "decode_undo", "apply_undo", "foresee_in_order"]

# A transaction's managers, made on first use (see ManagerOnFirstUse): set here, where the transaction
# and every manager are known, so that neither module imports the other.
SqlTransaction.rms = ManagerOnFirstUse("rms", _Rms)  # type: ignore[assignment]
SqlTransaction.rms_messages = ManagerOnFirstUse("rms_messages", _RmsMessages)  # type: ignore[assignment]
SqlTransaction.rmd = ManagerOnFirstUse("rmd", _Rmd)  # type: ignore[assignment]
SqlTransaction.invoker = ManagerOnFirstUse("invoker", _Invoker)  # type: ignore[assignment]
SqlTransaction.conditions = ManagerOnFirstUse("conditions", _Conditions)  # type: ignore[assignment]

"""PostgreSQL as an XA resource manager, over psycopg2's two-phase commit API.

:class:`PostgresXAResource` is what a JDBC driver calls an ``XAConnection``
and its ``XAResource`` in one: it owns one PostgreSQL session, runs at most one
branch on it at a time, and maps the XA verbs to ``PREPARE TRANSACTION``,
``COMMIT PREPARED`` and ``ROLLBACK PREPARED``: by SQL on the
:class:`~txmanager.lazy_begin.LazyBeginConnection` it opens (whose branch's
BEGIN goes with the branch's first statement), by psycopg2's ``tpc_*`` calls
on a connection of another class from a connection factory.  Errors
come back as :class:`~txmanager.xa.XAException` with the code an XA transaction
manager acts on.

:class:`XADataSource` is the application's side (the JTA ``DataSource`` of
Atomikos or Narayana): ``with ds.connection() as conn`` hands out a psycopg2
connection already enlisted in the thread's current transaction.

Facts this module is built on (checked against PostgreSQL 15 and psycopg2 2.9):

* A PostgreSQL transaction belongs to one session: two connections can never
  share a branch, so ``is_same_rm`` is true only for the same resource object.
* ``COMMIT PREPARED``/``ROLLBACK PREPARED`` of a branch prepared elsewhere must
  run outside any transaction, in the database where it was prepared; they run
  here on a separate autocommit "control" connection.
* ``PREPARE TRANSACTION`` in a failed transaction does not raise: it rolls
  back and reports ROLLBACK.  The branch's state is therefore checked first.
* A prepared transaction survives the session that prepared it and a crash of
  the server, and keeps its locks until someone commits or rolls it back.

The package's modules: :mod:`.resource` (the XA resource, and the sharing of
its session inside a global transaction), :mod:`.datasource` (the application's
side), :mod:`.branch` (one branch's state and statements) and :mod:`.server`
(what is asked of the server: prepared transactions enabled, the commit-mark
table, the database's identity).
"""

from __future__ import annotations

from ..lazy_begin import LazyBeginConnection
from .datasource import XADataSource
from .resource import PostgresXAResource, offer_session, session_for_database
from .server import check_prepared_transactions, create_mark_table, database_identity, default_resource_name

# the one-phase path's usual case in C when the extension was built (else, or with
# TXMANAGER_PURE_PYTHON=1, the Python path: the same)
from . import accelerated as _accelerated  # noqa: E402

_accelerated.install()

__all__ = ["LazyBeginConnection", "PostgresXAResource", "XADataSource", "check_prepared_transactions",
           "create_mark_table", "database_identity", "default_resource_name", "offer_session", "session_for_database"]

"""A psycopg2 connection that sends a branch's BEGIN with the branch's first statement.

psycopg2 opens every transaction with a ``BEGIN`` of its own, one round trip
before the first statement; a short transaction (BEGIN, UPDATE, COMMIT) spends a
third of its round trips on it.  :class:`LazyBeginConnection` runs a branch
with psycopg2 in autocommit mode and puts ``BEGIN;`` in front of the branch's
first statement, in the same query string: PostgreSQL runs both, and the
session is in the transaction block from then on, as with psycopg2's own BEGIN.
The branch ends by SQL (``COMMIT``, ``PREPARE TRANSACTION``, ``COMMIT PREPARED``)
instead of psycopg2's ``tpc_*`` calls, with the gid psycopg2 would write.

What the application sees does not change: statements run in the branch, a
failed one aborts it, ``commit()``/``rollback()`` on the connection raise as in
psycopg2's two-phase mode.  Where a statement could escape the branch, the
connection falls back to psycopg2's ``tpc_begin`` (its BEGIN round trip):

* a cursor this module cannot follow (another ``cursor_factory``, a named
  server-side cursor, a large object): from then on every branch of the
  connection uses ``tpc_begin``, since such a cursor may outlive the branch and
  run a statement before any other;
* a connection with a non-default isolation level, read-only or deferrable
  setting (psycopg2 sends those with its BEGIN).

A branch in which no statement ran sent nothing: it commits without a round
trip and answers ``prepare`` with "nothing to prepare" (XA_RDONLY).

A write whose outcome nobody reads can ride on the branch's next round trip
(:meth:`LazyBeginConnection.ride`): it goes in front of the next statement run
on the connection, in the same query string, or, when none comes, in front of
the branch's one-phase ``COMMIT`` or its ``PREPARE TRANSACTION``.  Same
transaction, same order of statements, one round trip less.  A write whose
outcome is read only after the commit, and which may decline, can ride on the
one-phase ``COMMIT`` itself (:meth:`LazyBeginConnection.ride_to_commit`): its
outcome is read by a statement after the ``COMMIT``, in the same query string.

``TXMANAGER_LAZY_BEGIN=0`` in the environment makes every branch use
``tpc_begin`` (psycopg2's BEGIN), for a comparison or a driver setup this
module does not know.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import psycopg2
import psycopg2.extensions as ext
from psycopg2 import sql as _sql

from .xid import Xid

__all__ = ["LazyBeginConnection", "LazyBeginCursor", "psycopg_xid"]

log = logging.getLogger(__name__)

#: psycopg2's own autocommit flag (the class below shows another during a branch)
_AUTOCOMMIT = ext.connection.autocommit
#: psycopg2's own session settings, which it sends with its BEGIN (watched below)
_ISOLATION_LEVEL = ext.connection.isolation_level
_READONLY = ext.connection.readonly
_DEFERRABLE = ext.connection.deferrable

_OFF = os.environ.get("TXMANAGER_LAZY_BEGIN") == "0"

#: psycopg2's own cursor(), which makes a cursor of the connection's ``cursor_factory``
_new_cursor = ext.connection.cursor
_execute = ext.cursor.execute

# A branch's modes (plain strings: compared by identity on the hot path).
_PENDING = "pending"    # started, nothing sent yet: BEGIN goes with the first statement
_SQL = "sql"            # BEGIN sent by this module; psycopg2 in autocommit mode
_PREPARED = "prepared"  # PREPARE TRANSACTION sent by this module
_TPC = "tpc"            # psycopg2's tpc_begin runs the branch
_PLAIN = "plain"        # begun here, then psycopg2 sent a BEGIN of its own (a named cursor
                        # opened mid-branch): psycopg2 believes it runs a plain transaction
_PLAIN_PREPARED = "plain-prepared"  # that, after PREPARE TRANSACTION


def psycopg_xid(xid: Xid) -> "ext.Xid | str":
    """What to hand to ``tpc_begin`` for ``xid``.

    Given the gid string, psycopg2 parses it back into an Xid (a regular
    expression and two base64 decodes, run as Python calls: measured at 2.5
    microseconds, a few percent of a one-phase transaction); an Xid built from
    the parts costs a tenth of that and writes the same gid.  psycopg2 only
    takes printable ASCII parts and a non-negative format id; any other xid
    goes as its gid.
    """
    gtrid, bqual = xid.gtrid, xid.bqual
    if xid.format_id >= 0 and gtrid.isascii() and bqual.isascii():
        g, b = gtrid.decode("ascii"), bqual.decode("ascii")
        if g.isprintable() and b.isprintable():
            return ext.Xid(xid.format_id, g, b)
    return xid.to_pg_gid()


#: :meth:`LazyBeginConnection.ride_to_commit`'s savepoint around its write, and its undoing
_RIDER_SAVEPOINT = b"SAVEPOINT txmanager_rider"
_RIDER_RELEASE = b"RELEASE SAVEPOINT txmanager_rider"
_RIDER_ROLLBACK = b"ROLLBACK TO SAVEPOINT txmanager_rider;RELEASE SAVEPOINT txmanager_rider"
#: a branch's BEGIN riding first (:meth:`LazyBeginConnection.ride_to_commit` on a branch that sent
#: nothing yet): compared by identity
_BEGIN = b"BEGIN"
#: the undoing of such a write, which has no savepoint: the transaction held nothing else
_RIDER_RESTART = b"ROLLBACK;BEGIN"


class CommitRider:
    """A write riding to a branch's one-phase COMMIT (:meth:`LazyBeginConnection.ride_to_commit`):
    its read (as sent), its read where it goes before the commit (``early``), who takes the row
    read, the SQLSTATE by which it declines, what does its work when it does, and what undoes it
    then (sent in front of that work)."""

    __slots__ = ("read", "early", "answer", "declined", "repair", "undo")

    def __init__(self, read: bytes, answer: Callable[[Any], None], declined: str,
                 repair: Callable[[], None], undo: bytes = _RIDER_ROLLBACK, early: bytes | None = None) -> None:
        self.read = read
        self.early = read if early is None else early
        self.answer = answer
        self.declined = declined
        self.repair = repair
        self.undo = undo


def _answer(rider: CommitRider, row: Any) -> None:
    """Hand ``row`` to the rider's ``answer``: a failure there is logged, not raised (the round
    trip's work is done, the COMMIT perhaps too: nothing of it is to undo or report as its)."""
    try:
        rider.answer(row)
    except Exception:  # noqa: BLE001 -- see above
        log.exception("the outcome of a write riding to the commit could not be taken: %r", row)


def raise_commit_refused(cur: Any) -> None:
    """Raise for a COMMIT that ``cur`` saw answered otherwise: PostgreSQL ends an aborted
    transaction's COMMIT with a ROLLBACK, and no error."""
    raise psycopg2.DatabaseError(f"COMMIT was answered {cur.statusmessage!r}: the transaction was "
                                 "rolled back (one of its statements failed)")


class LazyBeginCursor(ext.cursor):
    """The cursor of a :class:`LazyBeginConnection`: its first statement in a branch carries the BEGIN."""

    # No instance dict (psycopg2's cursor takes no attributes either): one made and freed with
    # every cursor was a tenth of what the one-phase path adds to a transaction (callgrind).
    __slots__ = ()

    def execute(self, query: Any, vars: Any = None) -> None:  # noqa: A002 -- psycopg2's name
        conn = self.connection
        if conn._mode is not _PENDING:
            if conn._lagging:  # a cursor kept from a branch, used after it
                conn._restore_autocommit()
            if conn._riding:  # writes riding on the branch's next round trip: this one
                return conn._execute_riding(self, query, vars)
            return _execute(self, query, vars)
        if type(query) is str:  # the usual first statement: _execute_first's first try, inline
            conn._mode = _SQL
            try:
                return _execute(self, "BEGIN;" + query, vars)
            except psycopg2.Error:
                return conn._begin_refused(self, query, vars)
        return conn._execute_first(self, query, vars)

    # The rest run their statements from C, past execute(): BEGIN goes first, on its own.

    def executemany(self, query: Any, vars_list: Any) -> None:
        self.connection._begin_now()
        return ext.cursor.executemany(self, query, vars_list)

    def callproc(self, procname: Any, parameters: Any = None) -> Any:
        self.connection._begin_now()
        return ext.cursor.callproc(self, procname, parameters)

    def copy_from(self, *args: Any, **kwargs: Any) -> None:
        self.connection._begin_now()
        return ext.cursor.copy_from(self, *args, **kwargs)

    def copy_to(self, *args: Any, **kwargs: Any) -> None:
        self.connection._begin_now()
        return ext.cursor.copy_to(self, *args, **kwargs)

    def copy_expert(self, *args: Any, **kwargs: Any) -> None:
        self.connection._begin_now()
        return ext.cursor.copy_expert(self, *args, **kwargs)


class LazyBeginConnection(ext.connection):
    """A psycopg2 connection whose XA branches send no BEGIN of their own (see the module).

    Made by ``psycopg2.connect(dsn, connection_factory=LazyBeginConnection)``;
    :class:`~txmanager.postgres.XADataSource` and the PostgreSQL WS-RM store
    make theirs so.  A connection of another class works too, with psycopg2's
    ``tpc_begin`` and its BEGIN round trip.
    """

    # Slots for this class's own state, read on every branch's start, statement and commit: in
    # an instance dict each read was a dict look-up (a tenth of a one-phase transaction's cost
    # above plain psycopg2, callgrind); ``__dict__`` stays for attributes others attach.
    __slots__ = ("_mode", "_xid", "_classic", "_tpc_only", "_own_cursor", "_lagging", "_riding", "_firsts",
                 "_rider", "__dict__")

    def __init__(self, dsn: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(dsn, *args, **kwargs)
        self.cursor_factory = LazyBeginCursor
        self._mode: str | None = None
        self._xid: Xid | None = None
        #: a cursor this module cannot follow was handed out: branches use tpc_begin from now on
        self._classic = False
        #: branches use tpc_begin (``_classic``, a session setting psycopg2 sends with its BEGIN,
        #: or TXMANAGER_LAZY_BEGIN=0): kept up to date where those change, so that a branch's
        #: start reads one flag rather than three of psycopg2's properties
        self._tpc_only = _OFF or self.isolation_level is not None or self.readonly is not None \
            or self.deferrable is not None
        self._own_cursor: Any = None
        #: psycopg2's autocommit flag is still on after a branch committed in one phase, while
        #: the connection shows it off: set back only when something is to run outside a branch
        #: (setting it costs more than the rest of the commit, and the next branch wants it on)
        self._lagging = False
        #: :meth:`ride`: statements (as sent, parameters in) for the branch's next round trip
        self._riding: list[bytes] = []
        #: :meth:`ride` with ``first``: how many of :attr:`_riding` (after a BEGIN riding) were given so
        self._firsts = 0
        #: :meth:`ride_to_commit`: the write riding last in :attr:`_riding`, in its savepoint
        self._rider: CommitRider | None = None

    # -- what the application calls ---------------------------------------------------------

    def cursor(self, name: str | None = None, cursor_factory: Any = None, scrollable: bool | None = None,
               withhold: bool = False) -> Any:
        if (name is None and cursor_factory is None and scrollable is None and not withhold
                and self.cursor_factory is LazyBeginCursor):
            # the usual call: no keywords for psycopg2 to parse; psycopg2's autocommit flag, if
            # still on since a branch (``_lagging``), is set back by the cursor's first statement
            return _new_cursor(self)
        if self._lagging:
            self._restore_autocommit()
        factory = cursor_factory or self.cursor_factory
        if name is None and isinstance(factory, type) and issubclass(factory, LazyBeginCursor):
            return ext.connection.cursor(self, cursor_factory=factory, withhold=withhold,
                                         scrollable=scrollable)
        self._cannot_follow(named=name is not None)
        return ext.connection.cursor(self, name, cursor_factory=cursor_factory, withhold=withhold,
                                     scrollable=scrollable)

    def lobject(self, *args: Any, **kwargs: Any) -> Any:
        self._restore_autocommit()
        self._cannot_follow(named=True)
        return ext.connection.lobject(self, *args, **kwargs)

    @property
    def autocommit(self) -> bool:
        """False during a branch, as in psycopg2's two-phase mode (psycopg2's own flag is on then)."""
        if self._mode is not None or self._lagging:
            return False
        return bool(_AUTOCOMMIT.__get__(self))

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._refuse_in_branch("set_session")
        self._lagging = False
        _AUTOCOMMIT.__set__(self, value)

    def set_session(self, *args: Any, **kwargs: Any) -> None:
        self._refuse_in_branch("set_session")
        self._restore_autocommit()
        try:
            ext.connection.set_session(self, *args, **kwargs)
        finally:
            self._settings_changed()

    def set_isolation_level(self, level: int | None) -> None:
        try:
            ext.connection.set_isolation_level(self, level)
        finally:
            self._settings_changed()

    @property
    def isolation_level(self) -> int | None:
        return _ISOLATION_LEVEL.__get__(self)

    @isolation_level.setter
    def isolation_level(self, value: Any) -> None:
        try:
            _ISOLATION_LEVEL.__set__(self, value)
        finally:
            self._settings_changed()

    @property
    def readonly(self) -> bool | None:
        return _READONLY.__get__(self)

    @readonly.setter
    def readonly(self, value: Any) -> None:
        try:
            _READONLY.__set__(self, value)
        finally:
            self._settings_changed()

    @property
    def deferrable(self) -> bool | None:
        return _DEFERRABLE.__get__(self)

    @deferrable.setter
    def deferrable(self, value: Any) -> None:
        try:
            _DEFERRABLE.__set__(self, value)
        finally:
            self._settings_changed()

    def _settings_changed(self) -> None:
        self._tpc_only = (_OFF or self._classic or _ISOLATION_LEVEL.__get__(self) is not None
                          or _READONLY.__get__(self) is not None or _DEFERRABLE.__get__(self) is not None)

    def commit(self) -> None:
        if self._mode is not None and self._mode is not _TPC:
            raise psycopg2.ProgrammingError("commit cannot be used during a two-phase transaction")
        self._restore_autocommit()
        ext.connection.commit(self)

    def rollback(self) -> None:
        if self._mode is not None and self._mode is not _TPC:
            raise psycopg2.ProgrammingError("rollback cannot be used during a two-phase transaction")
        self._restore_autocommit()
        ext.connection.rollback(self)

    def _restore_autocommit(self) -> None:
        """psycopg2's autocommit flag as the connection shows it, off (see ``_lagging``)."""
        if self._lagging:
            self._lagging = False
            if not self.closed:
                _AUTOCOMMIT.__set__(self, False)

    def _refuse_in_branch(self, what: str) -> None:
        if self._mode is not None and self._mode is not _TPC:
            raise psycopg2.ProgrammingError(f"{what} cannot be used inside a transaction")

    # -- the branch (called by PostgresXAResource) --------------------------------------------

    @property
    def in_branch(self) -> bool:
        return self._mode is not None

    @property
    def sent_nothing(self) -> bool:
        """True while the branch ran no statement (its BEGIN is still to be sent)."""
        return self._mode is _PENDING

    def ride(self, statement: str, params: Any = None, *, first: bool = False, begin: bool = False) -> bool:
        """Send ``statement`` (with ``params``, as ``cursor.execute`` takes them) with the
        branch's next round trip instead of one of its own: in front of the next statement run
        on this connection, in the same query string, or, when none comes, in front of the
        branch's one-phase ``COMMIT`` or its ``PREPARE TRANSACTION``.  For a write whose outcome
        (rows, count) nobody reads: the statements of the branch still run in the order they
        were given, in the branch, and commit or roll back with it.

        A ridden statement that fails raises, as psycopg2's error with its SQLSTATE, from the
        round trip it rode on: the next statement's ``execute`` (its note names the ridden
        statements), or the commit (the branch rolled back: the resource's XA_RB*, caused by
        that error); the branch is aborted, as it would have been by the statement on its own.
        Parameters psycopg2 refuses raise here, before anything is kept.  A rollback drops
        what had not been sent.

        False, having done nothing, where the branch is not run by SQL here (psycopg2's
        ``tpc_begin``, a named cursor's transaction, prepared already) or its BEGIN is still to
        be sent (nothing ran in it yet): then run the statement yourself.

        ``first``: in front of the statements riding already (given before it, not sent yet),
        but after those given ``first`` before it, in the order given: for a write that must run
        before them (a receipt that checks what they guessed).  Several such writes (the
        receipts of a batch's parts, each of one sequence) then lock their rows in the order
        given, as the general way's statements, sent at once, do: in the other order two
        batches could each hold a row the other waits for.

        ``begin``: on a branch that sent nothing yet, its ``BEGIN`` rides too, in front (a
        branch whose writes all ride to its commit sends them with it, in one round trip)."""
        mode = self._mode
        if mode is not _SQL and (mode is not _PENDING or not begin):
            return False
        if self._rider is not None:  # it rides last, to the commit: sent first, in order
            self._send_rider()
        sent = self._plain_cursor().mogrify(statement, params)
        riding = self._riding
        if mode is _PENDING:  # (nothing rides yet: ride_to_commit would have left _PENDING)
            self._mode = _SQL
            riding.append(_BEGIN)
        if first:
            riding.insert(self._firsts + 1 if riding and riding[0] is _BEGIN else self._firsts, sent)
            self._firsts += 1
        else:
            riding.append(sent)
        return True

    def ride_to_commit(self, statement: str, params: Any, *, read: str, read_params: Any,
                       answer: Callable[[Any], None], declined: str, repair: Callable[[], None],
                       early_read: tuple[str, Any] | None = None) -> bool:
        """Send ``statement`` with the branch's one-phase ``COMMIT``, in its query string, and
        read its outcome there too, after the ``COMMIT``: ``read`` (with ``read_params``), run
        once the branch committed, gives its first row to ``answer`` (before the commit
        returns).  For a write whose outcome is wanted only once the branch committed (a
        message's number, which its sender needs only to send it): the write costs no round
        trip of its own.

        The statement runs in a savepoint of its own, and may decline: fail with SQLSTATE
        ``declined`` (a division by zero on purpose) when what it expected does not hold.  The
        query string stops there (nothing after it runs, the ``COMMIT`` neither), the savepoint
        is rolled back (the branch keeps what ran before it), ``repair()`` does the work another
        way (its statements run in the branch, and need no read), and the branch commits after
        them.  Any other error is the commit's (the branch rolled back), as with :meth:`ride`.

        Where anything is to be sent first (a statement, a write given to :meth:`ride`, a
        ``PREPARE TRANSACTION``: the branch commits in two phases), the statement and its read,
        inside the branch, go first, in a round trip of their own, and may decline the same
        way: the branch's statements still run in the order they were given.  A rollback drops
        it, unsent and unread.

        On a branch that sent nothing yet, its ``BEGIN`` rides in front of the write: a
        branch whose only statement this is (the store's branch of a transaction whose
        decision its commit mark carries, :meth:`commit_branch_after`) sends it all in the
        round trip of its ``COMMIT``.  The write then needs no savepoint (a subtransaction,
        which costs the server an xid and WAL of its own): it runs first, before anything
        else of the branch is sent, so a decline rolls the whole transaction back and begins
        it again, in front of what ``repair()`` sends.

        ``early_read``: (statement, parameters) read in place of ``read`` where the write goes
        before the commit, inside the branch (its answer may then read what the write left,
        which after the ``COMMIT`` would cost a snapshot and the table's lock).

        False, having done nothing, where :meth:`ride` would be (but for a branch that sent
        nothing yet), or a write rides to the commit already."""
        mode = self._mode
        if (mode is not _SQL and mode is not _PENDING) or self._rider is not None:
            return False
        cur = self._plain_cursor()
        ahead = cur.mogrify(statement, params)
        after = cur.mogrify(read, read_params)
        early = None if early_read is None else cur.mogrify(*early_read)
        if mode is _PENDING:  # nothing rides yet (ride() takes nothing then): the BEGIN goes first
            self._mode = _SQL
            self._riding.extend((_BEGIN, ahead))
            self._rider = CommitRider(after, answer, declined, repair, _RIDER_RESTART, early)
            return True
        self._riding.extend((_RIDER_SAVEPOINT, ahead, _RIDER_RELEASE))
        self._rider = CommitRider(after, answer, declined, repair, early=early)
        return True

    def _commit_riding(self, cur: Any, last: bytes = b"") -> None:
        """The branch's one-phase ``COMMIT`` with what rides in front of it (:attr:`_riding` is
        not empty), and, where a write rides to the commit (:meth:`ride_to_commit`), its read
        after it: the whole query string ran, so the ``COMMIT`` did (a transaction that had
        failed before would fail its first statement, which stops the string).  ``last``: a
        statement (as sent, with its ``;``) that runs right before the ``COMMIT``, after the
        write riding to it and after what a declined one did instead (a commit mark)."""
        rider, self._rider = self._rider, None
        if rider is not None and self._riding and self._riding[-1] is _RIDER_RELEASE:
            # the write riding last: the COMMIT ends its savepoint with the transaction (a
            # RELEASE in front of it would be a statement more for the server, for nothing)
            self._riding.pop()
        if rider is None:
            cur.execute(self._take_riding(last + b"COMMIT"))
            if cur.statusmessage != "COMMIT":
                raise_commit_refused(cur)
            return
        try:
            cur.execute(self._take_riding(last + b"COMMIT;" + rider.read))
        except psycopg2.Error as exc:
            if not self._declined(exc, rider):
                raise
            if self._riding:  # repaired: the rest commits now
                return self._commit_riding(cur, last)
            cur.execute(last + b"COMMIT")
            if cur.statusmessage != "COMMIT":
                raise_commit_refused(cur)
            return
        _answer(rider, cur.fetchone())

    def _send_rider(self) -> None:
        """The write riding to the commit, and its read, in the branch, in a round trip of their
        own (with what rides in front of them): something else is to be sent first."""
        rider, self._rider = self._rider, None
        assert rider is not None
        cur = self._plain_cursor()
        riding = self._riding
        try:
            cur.execute(self._take_riding(rider.early))
        except psycopg2.Error as exc:
            if self._begin_again(riding):  # nothing ran: again, in the transaction, to fail there
                self._rider = rider
                return self._send_rider()
            if not self._declined(exc, rider):
                raise
            return
        _answer(rider, cur.fetchone())

    def _begin_again(self, riding: list[bytes]) -> bool:
        """After the write riding to the commit, sent with the branch's ``BEGIN`` in front of it
        (:meth:`ride_to_commit` on a branch that had sent nothing), failed: True when none of
        the string ran (the server refused it whole: a syntax error), and then the ``BEGIN`` is
        sent now, on its own, and the rest rides again, to fail inside the branch as it would
        after psycopg2's ``BEGIN`` (:meth:`_execute_after_begin`): no later statement of the
        branch runs outside it.  (The ``BEGIN`` rides only with such a write, which goes first,
        or with writes given to :meth:`ride` with ``begin``.)"""
        if not riding or riding[0] is not _BEGIN or self.closed \
                or self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
            return False
        with ext.cursor(self) as begin:
            begin.execute(_BEGIN)
        self._riding[:0] = riding[1:]
        return True

    def _declined(self, exc: psycopg2.Error, rider: "CommitRider") -> bool:
        """After the round trip that carried ``rider`` failed with ``exc``: True when the rider
        declined, and then its savepoint is rolled back (riding in front of what is sent next)
        and its ``repair()`` has run; False for any other failure."""
        if getattr(exc, "pgcode", None) != rider.declined or self.closed \
                or self.info.transaction_status != ext.TRANSACTION_STATUS_INERROR:
            return False
        self._riding = [rider.undo]
        self._firsts = 0
        log.debug("%r: a write riding to the commit declined (%s): done another way", self, exc.pgcode)
        try:
            rider.repair()
        except psycopg2.Error:
            raise
        except Exception as failed:  # the commit's caller sees a failed commit (the branch rolls back)
            raise psycopg2.DatabaseError(f"a write riding to the commit declined, and doing its work "
                                         f"another way failed: {failed!r}") from failed
        return True

    @property
    def can_ride(self) -> bool:
        """True while :meth:`ride` takes a statement (the branch runs by SQL and has begun)."""
        return self._mode is _SQL

    @property
    def can_ride_to_commit(self) -> bool:
        """True while :meth:`ride_to_commit` may take a write: the branch runs by SQL, begun or
        not yet (then its BEGIN rides too)."""
        return self._mode is _SQL or self._mode is _PENDING

    @property
    def rider_waiting(self) -> bool:
        """True while a write rides to the commit (:meth:`ride_to_commit`), not sent yet."""
        return self._rider is not None

    def send_riding(self) -> None:
        """Send what rides (the write riding to the commit first, and its read: its answer is
        given now) in a round trip of its own, now: for a caller that wants the ride's outcome
        before the commit instead of a statement of its own."""
        self._send_riding()

    @property
    def riding(self) -> int:
        """How many statements wait to ride on the branch's next round trip (:meth:`ride`)."""
        return len(self._riding)

    def _take_riding(self, then: bytes, *, formatted: bool = False) -> bytes:
        """``then`` with the statements riding in front of it (taken off: sent now)."""
        riding, self._riding = self._riding, []
        self._firsts = 0
        ahead = b";".join(riding) + b";"
        if formatted:  # psycopg2 formats the whole query string: a ``%`` in them must stay one
            ahead = ahead.replace(b"%", b"%%")
        return ahead + then

    def _execute_riding(self, cur: LazyBeginCursor, query: Any, vars: Any) -> None:  # noqa: A002
        """Run ``query`` with the riding statements in front of it, in one query string."""
        if self._rider is not None:  # a write riding to the commit: it goes first, in order
            self._send_rider()
            if not self._riding:
                return _execute(cur, query, vars)
        riding, firsts = self._riding, self._firsts
        if isinstance(query, _sql.Composable):
            query = query.as_string(cur)
        if isinstance(query, str):
            query = query.encode(ext.encodings.get(self.encoding, "utf-8"))
        try:
            return _execute(cur, self._take_riding(query, formatted=vars is not None), vars)
        except BaseException as exc:
            if not self.closed and self.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS:
                self._riding[:0] = riding  # nothing ran (psycopg2 refused the parameters): they still ride
                self._firsts = firsts
            elif self._begin_again(riding):  # nothing ran, the BEGIN riding first neither: again, begun
                self._firsts = firsts
                return self._execute_riding(cur, query, vars)
            elif isinstance(exc, psycopg2.Error):
                exc.add_note(f"{len(riding)} statement(s) ridden ahead of it (LazyBeginConnection.ride) ran "
                             "in this query string first: the error may be theirs")
            raise

    def _send_riding(self) -> None:
        """The riding statements, now, in a round trip of their own (before a statement this
        class cannot put them in front of)."""
        if self._rider is not None:
            self._send_rider()
        if self._riding:
            self._plain_cursor().execute(self._take_riding(b""))

    def begin_branch(self, xid: Xid) -> None:
        """Start branch ``xid``: nothing is sent (psycopg2's ``tpc_begin`` sends nothing either)."""
        if self._tpc_only:
            self._restore_autocommit()
            self.tpc_begin(psycopg_xid(xid))
            self._mode = _TPC
            return
        if self._lagging:  # on still since the last branch
            self._lagging = False
        else:
            _AUTOCOMMIT.__set__(self, True)  # a flag of psycopg2's: no round trip
        self._xid = xid
        self._mode = _PENDING

    def begin_unnamed(self) -> bool:
        """:meth:`begin_branch` of a branch whose xid comes later, if ever (only PREPARE
        needs it: give it as ``_xid`` before); False, having done nothing, where psycopg2's
        ``tpc_begin`` runs the branch, which takes the xid now."""
        if self._tpc_only:
            return False
        if self._lagging:  # on still since the last branch
            self._lagging = False
        else:
            _AUTOCOMMIT.__set__(self, True)
        self._mode = _PENDING
        return True

    def prepare_branch(self) -> bool:
        """PREPARE the branch; False when no statement ran (nothing to prepare: it is over)."""
        mode = self._mode
        if mode is _PENDING:
            self._branch_over()
            return False
        if mode is _TPC:
            self.tpc_prepare()
            return True
        assert self._xid is not None
        self._by_sql("PREPARE TRANSACTION %s", (self._xid.to_pg_gid(),), "PREPARE TRANSACTION")
        self._mode = _PREPARED if mode is _SQL else _PLAIN_PREPARED
        return True

    def commit_branch(self) -> None:
        """Commit the branch: in one phase, or its prepared transaction when it was prepared here."""
        if self._mode is _SQL:  # the usual one-phase case, without the general path's calls
            cur = self._own_cursor
            if cur is None or cur.closed:
                self._own_cursor = cur = ext.cursor(self)
            # what _by_sql does, inline (bytes: psycopg2 encodes no str), with what rides on it
            if self._riding:
                self._commit_riding(cur)
            else:
                cur.execute(b"COMMIT")
                if cur.statusmessage != "COMMIT":
                    raise_commit_refused(cur)
            self._mode = self._xid = None
            self._lagging = True  # psycopg2's flag stays on until something runs outside a branch
            return
        self._end(commit=True)
        self._branch_over()

    def commit_branch_after(self, statement: str, params: tuple[Any, ...]) -> bool:
        """Run ``statement`` and commit the branch in one phase, in one query string (one round
        trip, not two); False, having run nothing, where psycopg2 runs the branch (then run the
        statement and :meth:`commit_branch`).  A failed statement leaves the branch aborted, to
        roll back; the COMMIT runs only after the statement did."""
        mode = self._mode
        if mode is not _SQL and mode is not _PENDING:
            return False
        if self._rider is not None:
            # a write riding to the COMMIT (:meth:`ride_to_commit`), its BEGIN perhaps: the
            # statement goes after it (and after what a declined one does instead), in the same
            # round trip, and the write's read after the COMMIT
            cur = self._plain_cursor()
            self._commit_riding(cur, cur.mogrify(statement, params) + b";")
            self._branch_over()
            return True
        begin = "BEGIN;" if mode is _PENDING else ""
        self._mode = _SQL
        self._by_sql(f"{begin}{statement};COMMIT", params, "COMMIT")
        self._branch_over()
        return True

    def rollback_branch(self) -> None:
        """Roll the branch back, prepared here or not; the branch is over even when this raises."""
        try:
            self._end(commit=False)
        finally:
            self._branch_over()

    # -- inside -------------------------------------------------------------------------------------

    def _branch_over(self) -> None:
        mode, self._mode, self._xid = self._mode, None, None
        if self._riding:  # the branch ended without them (it failed): they go with it
            self._riding = []
            self._firsts = 0
            self._rider = None
        if (mode is _PLAIN or mode is _PLAIN_PREPARED) and not self.closed \
                and self.status != ext.STATUS_READY:
            # psycopg2 still believes in its BEGIN (the session is idle after PREPARE or COMMIT
            # PREPARED): its ROLLBACK ends that belief, with a warning from the server
            ext.connection.rollback(self)
        if mode is not _TPC and not self.closed and _AUTOCOMMIT.__get__(self):
            _AUTOCOMMIT.__set__(self, False)

    def _end(self, *, commit: bool) -> None:
        """COMMIT or ROLLBACK the branch the way it was begun (PREPARED when it was prepared)."""
        verb = "COMMIT" if commit else "ROLLBACK"
        if not commit and self._riding:
            self._riding = []  # never sent: nothing to undo
            self._firsts = 0
            self._rider = None
        mode = self._mode
        if mode is _TPC:
            self.tpc_commit() if commit else self.tpc_rollback()
        elif mode is _PREPARED or mode is _PLAIN_PREPARED:
            assert self._xid is not None
            self._by_sql(f"{verb} PREPARED %s", (self._xid.to_pg_gid(),), f"{verb} PREPARED")
        elif mode is _PLAIN:
            ext.connection.commit(self) if commit else ext.connection.rollback(self)
        elif mode is _SQL and (commit or self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE):
            self._by_sql(verb, None, verb)
        # _PENDING: nothing was sent, nothing to end

    def _plain_cursor(self) -> Any:
        """One plain cursor kept for the branch's own statements: making one per COMMIT was a
        visible share of a one-phase transaction's client CPU."""
        cur = self._own_cursor
        if cur is None or cur.closed:
            self._own_cursor = cur = ext.cursor(self)
        return cur

    def _by_sql(self, statement: str, params: tuple[Any, ...] | None, expected: str) -> None:
        cur = self._plain_cursor()
        if self._rider is not None:  # a write riding to a one-phase COMMIT: in front of this one, read
            self._send_rider()
        if self._riding:  # a COMMIT or PREPARE TRANSACTION: what rides goes in front of it
            query: Any = self._take_riding(statement.encode(ext.encodings.get(self.encoding, "utf-8")),
                                           formatted=params is not None)
            cur.execute(query, params)
        else:
            cur.execute(statement, params)
        answer = cur.statusmessage
        if answer != expected:
            # PostgreSQL ends an aborted transaction's COMMIT or PREPARE with a ROLLBACK, and no error
            raise psycopg2.DatabaseError(f"{expected} was answered {answer!r}: the transaction was "
                                         "rolled back (one of its statements failed)")

    def _execute_first(self, cur: LazyBeginCursor, query: Any, vars: Any) -> None:  # noqa: A002
        self._mode = _SQL
        if isinstance(query, _sql.Composable):
            query = query.as_string(cur)
        prefixed = b"BEGIN;" + query if isinstance(query, bytes) else "BEGIN;" + query
        try:
            return ext.cursor.execute(cur, prefixed, vars)
        except psycopg2.Error:
            if self.closed or self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
                raise
        return self._execute_after_begin(cur, query, vars)

    def _begin_refused(self, cur: LazyBeginCursor, query: Any, vars: Any) -> None:  # noqa: A002
        """In an ``except`` of the psycopg2 error that the first statement's ``BEGIN;`` query
        string met (the C one-phase path calls it so too): raise that error again unless none of
        the string ran, else begin and run the statement again (:meth:`_execute_after_begin`)."""
        if self.closed or self.info.transaction_status != ext.TRANSACTION_STATUS_IDLE:
            raise  # noqa: PLE0704 -- the error being handled by the caller
        return self._execute_after_begin(cur, query, vars)

    def _execute_after_begin(self, cur: LazyBeginCursor, query: Any, vars: Any) -> None:  # noqa: A002
        """The first statement's query string did not parse (or psycopg2 refused its
        parameters), so its BEGIN never ran either: begin now and run the statement again, to
        fail inside the transaction as it would after psycopg2's BEGIN (the branch can then
        only roll back, and no later statement runs outside it)."""
        with ext.cursor(self) as begin:
            begin.execute("BEGIN")
        return ext.cursor.execute(cur, query, vars)

    def _begin_now(self) -> None:
        if self._lagging:
            self._restore_autocommit()
        if self._riding:  # before a statement that runs past execute(): they go first
            self._send_riding()
        if self._mode is _PENDING:
            self._mode = _SQL
            with ext.cursor(self) as cur:
                cur.execute("BEGIN")

    def _cannot_follow(self, *, named: bool) -> None:
        """A cursor (or large object) this class cannot see the statements of is handed out."""
        if not self._classic:
            log.debug("%r: a cursor it cannot follow; its branches use tpc_begin from now on", self)
        self._classic = self._tpc_only = True
        if self._riding:  # before the cursor's statements, which this class cannot see
            self._send_riding()
        mode = self._mode
        if mode is _PENDING and self._xid is None:
            # a branch with no xid yet (begin_unnamed) cannot go to tpc_begin: its BEGIN goes now
            self._begin_now()
            mode = _SQL
        if mode is _PENDING:  # nothing sent yet: psycopg2's own two-phase mode can still take over
            assert self._xid is not None
            _AUTOCOMMIT.__set__(self, False)
            self.tpc_begin(psycopg_xid(self._xid))
            self._mode = _TPC
        elif mode is _SQL and named:
            # psycopg2 opens a named cursor only in a transaction of its own: it sends a BEGIN
            # (the server warns that one is open) and ends the branch with its commit()
            _AUTOCOMMIT.__set__(self, False)
            self._mode = _PLAIN

"""A store transaction on one DB-API connection (:class:`SqlTransaction`).

It runs the managers' statements, takes the store's lock order (RMD, invoker buffer,
RMS: seed 004), keeps the rows it locked so it does not read them twice, and, for the
SQLite store's XA support, can capture undo: before any write, the before-image of every
row it touches (or "did not exist") is kept, keyed by table and primary key.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

from .. import api
from ..api import (
    RANK_INVOKER,
    RANK_RMD,
    RANK_RMS,
    BufferedMessage,
    RmdSequence,
    RmsSequence,
    UnknownSequenceError,
    _now,
)
from . import placeholders
from .dialect import Dialect
from .literals import inline
from .rows import _RMD_COLS, PRIMARY_KEYS, _cols, _rmd
from .statements import (
    _DECLINED,
    _RECEIVE_IN_ORDER,
    _RECEIVE_IN_ORDER_CHECKED,
    _RECEIVE_IN_ORDER_NOTED,
    _RECEIVED,
    _RECEIPT_SET,
    _RECEIVED_AND_TAKEN,
    _take,
    _committed_if_expected,
    _receipt_and_take_params,
    _receipt_checked,
    _receipt_params,
    _prefix,
    _rmd_assignments,
    _take_params,
    ahead_key,
)
from .undo import UndoLog

if TYPE_CHECKING:
    from ..prepared import PreparedStatements


#: statements sent in one round trip, with their parameters
_Statements = list[tuple[str, Sequence[Any]]]
#: writes riding at once at most (:meth:`SqlTransaction.write_later`): the next one is sent,
#: with them, in a round trip of its own (a transaction enqueuing thousands, a Spark partition
#: under XA, keeps a bounded query string in memory, not all of its messages)
RIDING_AT_MOST = 64


class SqlTransaction(api.StoreTransaction):
    """A store transaction on one DB-API connection.

    ``finish(tx, commit)`` is the owning store's callback that ends the
    database transaction and gives the connection back.  ``conn`` None: a
    deferred transaction (``SqliteStore.begin_deferred``), given its
    connection by the store's ``_attach`` at its first statement.  When ``capture_undo``
    is set, :attr:`undo` collects the before-image of every row the
    transaction writes, the first time it writes it (the SQLite store's XA
    prepare keeps them durably).
    """

    # made on first use (see ManagerOnFirstUse; the package sets them once its managers are defined)
    rms: api.RmsSequenceManager
    rms_messages: api.RmsMessageManager
    rmd: api.RmdSequenceManager
    invoker: api.InvokerBufferManager

    def __init__(self, store: Any, conn: Any, dialect: Dialect, *, capture_undo: bool = False) -> None:
        super().__init__()
        self._store = store
        self.conn = conn
        self.d = dialect
        #: psycopg2's placeholders: plain parameters are written into the text here (:mod:`.literals`)
        self._inlines = dialect.placeholder == "%s"
        self.undo: UndoLog | None = {} if capture_undo else None
        self._global: Any = None
        #: Set by a store whose connection is in autocommit mode for this transaction (the
        #: PostgreSQL store's local transactions): the transaction is opened by a BEGIN sent in
        #: the same round trip as its first statement that writes or locks rows; plain reads
        #: before that run on their own, which under READ COMMITTED (a new snapshot for every
        #: statement, in a transaction or not) reads exactly the same.  A poll that finds
        #: nothing then costs one round trip instead of three (BEGIN, SELECT, COMMIT), and every
        #: other transaction one less.  The store ends it (:attr:`begun`) with COMMIT/ROLLBACK.
        self.lazy_begin = False
        #: sent right after the lazy BEGIN (settings of this transaction only)
        self.begin_with = ""
        self.begun = False
        #: :meth:`next_write_commits`: the next statement that opens the transaction goes without
        #: BEGIN (its query string's own transaction, which PostgreSQL commits as it ends)
        self.commits_alone = False
        self.committed_alone = False
        #: The commit waits for the disk (False: begun with ``durable=False``; the SQLite store
        #: then returns from the commit without waiting for the WAL's fsync, which the next
        #: durable commit's covers, as WAL commits reach the disk in their order).
        self.waits_for_disk = True
        #: :meth:`wait_for_disk_later`: the SQLite store's commit counts as durable for its
        #: readers but returns before the fsync.
        self.returns_before_disk = False
        #: Set by the store (or :meth:`_receive_ahead`) to its commit's number when that commit
        #: returned before the disk: what :meth:`wait_for_disk` waits for.
        self._commit_seq = 0
        self._wrote = False
        self._savepoints = 0
        #: the store's prepared statements (PostgreSQL), or None: every statement sent as text
        self._statements: PreparedStatements | None = getattr(store, "statements", None)
        #: invoker rows this transaction holds locked, as it last wrote or read them: sequence id
        #: -> (delivered ranges, in-order prefix).  Nobody else can change a row while it is held,
        #: so a batch of deliveries reads each once.  Cleared when a savepoint rolls back.
        self.held_invoker: dict[str, tuple[api.AckRanges, int]] = {}
        #: RMD rows this transaction holds locked, as it last read or wrote them (a receive reads
        #: its sequence's row once, not again for each change).  Cleared when a savepoint rolls back.
        self.held_rmd: dict[str, RmdSequence] = {}
        #: Buffered messages read ahead for a batch of in-order deliveries: sequence id -> number
        #: -> message, for sequences whose invoker row this transaction holds.  Only a delivery
        #: removes a buffered message, so what was read stays true.  Cleared with held_invoker.
        self.read_ahead: dict[str, dict[int, BufferedMessage]] = {}
        #: The same for RMS rows (an enqueue reads its sequence once per batch of sends).
        self.held_rms: dict[str, RmsSequence] = {}
        #: Keys of :attr:`held_rms` held only ``FOR KEY SHARE`` (beside enqueues: another
        #: transaction may take the sequence's next number meanwhile); the others are held
        #: against every writer (FOR UPDATE, or written by this transaction).
        self.shared_rms: set[str] = set()
        #: Numbers enqueue handed out and not yet written to their rms_sequence row: key ->
        #: (highest number, the last one).  See :meth:`flush`.
        self._numbered: dict[str, tuple[int, bool]] = {}
        #: Sequences whose row an enqueue of this transaction changed already (a later enqueue on
        #: one only remembers its number, in :attr:`_numbered`).
        self.took_number: set[str] = set()
        #: Sequences whose number an enqueue riding to the commit takes (:meth:`write_at_commit`):
        #: the ride's read gives the row (held from then on), should it be wanted before the commit.
        self.riding_rms: set[str] = set()
        #: Store calls whose statements a receipt ran ahead, in its round trip (:meth:`receive_in_order`'s
        #: ``answering`` and ``acknowledging``): key (``ahead_key``) -> their last statement's row,
        #: for the call (``rms_messages.mark_answered_acknowledging``, ``acknowledge_sequence``) to
        #: take without a statement.  Empty at the commit: writes no one took would be work no one
        #: accounted for.
        self.ran_ahead: dict[tuple[Any, ...], Any] = {}
        #: RMS rows taken as held without a read (:meth:`foresee_sequence`): key -> the next number
        #: they said, which :meth:`receive_at_commit` checks before the commit.
        self.foreseen: dict[str, int] = {}
        # rms, rms_messages, rmd and invoker: made on first use (see ManagerOnFirstUse)

    # -- statements -----------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] = (), *,
                then: tuple[str, Sequence[Any]] | list[tuple[str, Sequence[Any]]] | None = None,
                declined: str | None = None) -> Any:
        """Run ``sql``; ``then``: a second statement (or a list of them) sent in the same round
        trip, whose (last one's) results the cursor holds (PostgreSQL runs each after the one
        before, with a snapshot of its own).  ``declined``: the SQLSTATE by which a round trip
        that commits alone (:meth:`next_write_commits`) says it wrote nothing after all (its
        query string's transaction rolled back as a whole): None is returned then, the
        transaction not doomed and nothing begun."""
        self._check_open()
        after = [] if then is None else then if isinstance(then, list) else [then]
        if self._numbered and ("rms_sequence" in sql or any("rms_sequence" in t[0] for t in after)):
            self.flush()  # the statement reads or writes what enqueue has only remembered so far
        if self.conn is None:  # a deferred transaction's first statement (SqliteStore.begin_deferred)
            self._store._attach(self)
        begin = ""
        if self.lazy_begin and not self.begun and (_opens_transaction(sql) or then is not None):
            if self.commits_alone:  # committed as the query string ends
                begin = self.begin_with
                self.commits_alone = False
                self.committed_alone = True
            else:
                if self.committed_alone:  # after a write that committed alone: its locks are gone
                    self._forget_held()
                begin = "BEGIN; " + self.begin_with
                self.begun = True
        statements = self._statements
        cur = None
        try:  # a session lost while preparing fails here too, and is translated like any other
            text, params = self._text(sql, params)
            text = begin + text
            for statement, values in after:
                more, values = self._text(statement, values)
                text += "; " + more
                params = (*params, *values)
            sent = tuple(params)
            if self._inlines:
                text, sent = inline(self.conn, text, sent)  # type: ignore[assignment]
            cur = self.conn.cursor()
            cur.execute(text, sent)
        except Exception as exc:
            if cur is not None:
                cur.close()
            if declined is not None and self.committed_alone and getattr(exc, "pgcode", None) == declined:
                self.committed_alone = False  # nothing of it happened: the session is as before it
                return None
            if statements is not None:
                statements.failed(self.conn, exc)
            self._fail(exc)
        return cur

    @property
    def rides_writes(self) -> bool:
        """Can a write ride on the transaction's next round trip (:meth:`write_later`)?  On a
        branch of a global transaction whose session sends it by SQL
        (:meth:`txmanager.lazy_begin.LazyBeginConnection.ride`)."""
        return self._global is not None and getattr(self.conn, "can_ride", False)

    @property
    def rides_first_writes(self) -> bool:
        """Can :meth:`write_first`'s writes ride on the transaction's next round trip?  Where
        :attr:`rides_writes`, and on such a branch that sent nothing yet too: its BEGIN rides
        in front of them (a batch whose receipts all ride to the store's commit sends the
        branch whole with it: ``LazyBeginConnection.ride(begin=True)``)."""
        return self._global is not None and getattr(self.conn, "can_ride_to_commit", False)

    def write_later(self, sql: str, params: Sequence[Any] = ()) -> None:
        """A write whose outcome (its count) nobody reads: where :attr:`rides_writes`, it rides on
        the transaction's next round trip (the next statement's query string, or the branch's
        COMMIT or PREPARE TRANSACTION) instead of taking one of its own; else it runs now.  The
        transaction's statements still run in the order they were given.  A failure of it is
        raised by the round trip it rides on (a statement's error, or the commit's: the global
        transaction rolled back), with PostgreSQL's SQLSTATE."""
        if not self.rides_writes or self.conn.riding >= RIDING_AT_MOST:
            self.write(sql, params)  # (they go in front of it)
            return
        self._check_open()
        if self._numbered and "rms_sequence" in sql:
            self.flush()  # as execute: what enqueue only remembered goes first
        try:
            rode = self.conn.ride(*self._sent(sql, params))
        except Exception as exc:
            if self._statements is not None:
                self._statements.failed(self.conn, exc)
            self._fail(exc)
        if not rode:  # the session cannot take it after all
            self.write(sql, params)
            return
        self._wrote = True

    def write_first(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Writes whose outcome nobody reads, to run before the writes riding already
        (:meth:`write_later`) and what the commit flushes: where :attr:`rides_writes`, in front
        of them on the transaction's next round trip, in the order given and after those given
        here before them (a batch's receipts, one per part: they lock their sequences in the
        order of the parts, ascending as the general way's do, not the other way round, which
        could deadlock against another batch); else now, in one round trip.  For a receipt that
        checks, before the commit, what the writes after it guessed (it fails on purpose, and
        the transaction with it, where they guessed wrong).
        On a branch that sent nothing yet, its BEGIN rides in front of them
        (:attr:`rides_first_writes`)."""
        if not self.rides_first_writes or self.conn.riding + len(statements) > RIDING_AT_MOST:
            (sql, params), *rest = statements
            self._wrote = True
            self.execute(sql, params, then=list(rest) or None).close()
            return
        self._check_open()
        try:
            for sql, params in statements:
                if not self.conn.ride(*self._sent(sql, params), first=True, begin=True):
                    raise AssertionError("a session that rides writes refused one")  # (checked above)
        except Exception as exc:
            if self._statements is not None:
                self._statements.failed(self.conn, exc)
            self._fail(exc)
        self._wrote = True

    def write_at_commit(self, sql: str, params: Sequence[Any], read: str, read_params: Sequence[Any],
                        answer: Callable[[Any], None], otherwise: Callable[[], None],
                        early_read: tuple[str, Sequence[Any]] | None = None) -> bool:
        """A write whose outcome is wanted only once the transaction committed, sent with the
        branch's one-phase COMMIT (:meth:`txmanager.lazy_begin.LazyBeginConnection.ride_to_commit`):
        ``read`` (with ``read_params``), run after the COMMIT in the same query string, gives
        ``answer`` its row.  The write may decline with :data:`_DECLINED` (nothing of it stays):
        then ``otherwise()`` runs, in this transaction, before it commits.  ``early_read``: the
        read, inside the branch, where the write goes before the commit (something else is sent
        first; seldom: never prepared).  False, nothing done, where the write cannot ride (a
        branch of a global transaction whose session sends it by SQL, begun or not: its BEGIN
        rides too), or one rides so already."""
        if self._global is None or not getattr(self.conn, "can_ride_to_commit", False):
            return False
        self._check_open()
        if self._numbered:
            self.flush()  # as execute: what enqueue only remembered goes first
        try:
            statement, values = self._sent(sql, params)
            read_text, read_values = self._sent(read, read_params)
            early = None if early_read is None else self._sent(*early_read, prepare=False)
            rode = self.conn.ride_to_commit(statement, values, read=read_text, read_params=read_values,
                                            answer=answer, declined=_DECLINED, repair=otherwise,
                                            early_read=early)
        except Exception as exc:
            if self._statements is not None:
                self._statements.failed(self.conn, exc)
            self._fail(exc)
        if rode:
            self._wrote = True
        return rode

    def hold_riding_rms(self, key: str) -> None:
        """Sequence ``key`` wanted before the commit whose enqueue rides to it (its number taken
        there, :attr:`riding_rms`): the write and its read are sent now, in a round trip of their
        own, and the read's row is held from then on (see ``enqueue_claiming_at_commit``)."""
        if key not in self.riding_rms or key in self.held_rms \
                or not getattr(self.conn, "rider_waiting", False):
            return
        try:
            self.conn.send_riding()
        except Exception as exc:
            if self._statements is not None:
                self._statements.failed(self.conn, exc)
            self._fail(exc)

    def _fail(self, exc: Exception) -> NoReturn:
        """Doom the transaction for the driver's error ``exc`` and raise it as the store's own
        exception when there is one for it: a statement and a COPY fail alike."""
        translated = self._store._translate(exc)
        self._doom(translated or exc)
        if translated is not None:
            raise translated from exc
        raise exc

    def copy_in(self, table: str, columns: Sequence[str], types: Sequence[str], row: Sequence[Any]) -> None:
        """Insert one row with ``COPY ... FROM STDIN (FORMAT binary)`` (PostgreSQL): for a row with
        a large payload, which as a literal in a statement's text costs the server its lexer over
        twice the payload's size (psycopg2 sends bytea in hex) and the client that hex, both more
        than the rest of the enqueue; in COPY's binary format the payload goes as it is, after a
        length.  ``types`` name each column's binary form: ``text``, ``bytea``, ``int8``,
        ``int4``, ``float8`` or ``bool``."""
        self._check_open()
        self._wrote = True
        try:
            cur = self.conn.cursor()
            try:
                if self.lazy_begin and not self.begun:  # COPY runs inside the transaction
                    cur.execute("BEGIN; " + self.begin_with)
                    self.begun = True
                pieces = _copy_pieces(row, types, getattr(self.conn, "encoding", "UTF8"))
                cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT binary)",
                                _Pieces(pieces), size=1 << 20)
            finally:
                cur.close()
        except Exception as exc:
            self._fail(exc)

    def copy_out_payloads(self, table: str, keys: str,
                          wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], bytes]:
        """The ``payload`` of the rows of ``table`` whose two key columns (``keys``: "a, b", a text
        and a bigint) are among ``wanted``, read with ``COPY ... TO STDOUT (FORMAT binary)`` (PostgreSQL): as its
        bytes, where a SELECT brings it in hex, twice its size, for the server to encode and
        this side to decode."""
        self._check_open()
        if not wanted:
            return {}
        try:
            cur = self.conn.cursor()
            try:
                rows = ", ".join(cur.mogrify("(%s, %s)", pair).decode() for pair in wanted)
                chunks = _Chunks()
                cur.copy_expert(f"COPY (SELECT {keys}, payload FROM {table} WHERE ({keys}) IN ({rows})) "
                                "TO STDOUT (FORMAT binary)", chunks)
            finally:
                cur.close()
        except Exception as exc:
            self._fail(exc)
        codec = _codec(getattr(self.conn, "encoding", "UTF8"))
        return {(first.decode(codec), struct.unpack(">q", second)[0]): payload
                for first, second, payload in _copy_rows(chunks.received)}

    def _sent(self, sql: str, params: Sequence[Any], *, prepare: bool = True) -> tuple[str, tuple[Any, ...] | None]:
        """What is given to psycopg2 for ``sql`` (a ride's): its text (:meth:`_text`, with the plain
        parameters written in) and the parameters left, None when none is."""
        text, params = self._text(sql, params, prepare=prepare)
        if self._inlines:
            return inline(self.conn, text, params)
        return text, tuple(params) or None

    def _text(self, sql: str, params: Sequence[Any], *, prepare: bool = True) -> tuple[str, Sequence[Any]]:
        """What is sent for ``sql`` with ``params``: ``EXECUTE`` of its prepared statement and its
        arguments (:meth:`~..prepared.PreparedStatements.sent`), or (also without ``prepare``) the
        statement and ``params``."""
        statements = self._statements if prepare else None
        sent = None if statements is None else statements.sent(self.conn, sql, params)
        if sent is not None:
            return sent
        return placeholders.expand(sql, params) if self._inlines else (self.d.sql(sql), params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cur = self.execute(sql, params)
        row = cur.fetchone()
        cur.close()
        return row

    def locked_sequence(self, rank: int, held: dict[str, Any], key: str, select: str,
                        parse: Callable[[Any], Any]) -> Any:
        """A sequence's record, locked for the rest of this transaction; None if there is none.

        What this transaction read once stays locked and unchanged by anyone else,
        so the second ask is answered from ``held`` without a round trip.
        """
        self.lock(rank, key)
        seq = held.get(key)
        if seq is not None:
            return seq
        row = self.one(select + self.d.for_update, (key,))
        if row is None:
            return None
        seq = held[key] = parse(row)
        return seq

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        cur = self.execute(sql, params)
        rows = cur.fetchall()
        cur.close()
        return rows

    def write(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._wrote = True
        cur = self.execute(sql, params)
        count = cur.rowcount
        cur.close()
        return count

    def write_all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """A write with RETURNING: every changed row's values, without a second round trip."""
        self._wrote = True
        return self.all(sql, params)

    def receive_and_take(self, sequence_id: str, number: int, *, last: bool = False,
                         now: float | None = None) -> bool:
        """On PostgreSQL, one statement: the received ranges written and the message taken,
        where the two steps took a round trip each.  The sequence's RMD row is held (the
        receive read it FOR UPDATE), so its new image is known without reading it back; the
        take is :meth:`_Invoker.take_next`'s own statement (and its waiting for a delivery in
        progress with it)."""
        if not self.d.for_update or number < 2:  # SQLite; a first message's row may not exist
            return super().receive_and_take(sequence_id, number, last=last, now=now)
        seq, changes = self.rmd._receipt(sequence_id, number, last=last, now=now)
        self.lock(RANK_INVOKER, sequence_id)
        self.capture_key("rmd_sequence", sequence_id)
        self.capture_key("invoker_sequence", sequence_id)
        sets, values = _rmd_assignments(changes)
        self._wrote = True
        row = self.one(
            f"WITH r AS (UPDATE rmd_sequence SET {sets} WHERE sequence_id = ? RETURNING 1), "
            f"t AS ({_take(len(values) + 2)}) "
            "SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM t WHERE taken)",
            (*values, sequence_id, *_take_params(sequence_id, number)))
        if not row[0]:
            raise UnknownSequenceError("RMD", sequence_id)
        self.held_rmd[sequence_id] = replace(seq, **changes)
        return self.note_take(sequence_id, number, bool(row[1]))

    def receive_in_order(self, sequence_id: str, number: int, *, now: float | None = None,
                         answering: tuple[str, str, Sequence[tuple[int, int]], bool] | None = None,
                         acknowledging: tuple[str, Sequence[tuple[int, int]], bool] | None = None,
                         take: bool = True, commits: tuple[str, str | None, tuple[str, ...]] | None = None
                         ) -> tuple[RmdSequence, bool] | None:
        """On PostgreSQL, one statement: the receipt written and the message taken, if the
        sequence has received exactly 1..number-1 and is open.

        The common receive of a steady stream; the receives of its sequence
        behind it wait for its commit.  The receipt's UPDATE takes the row's
        lock, and the take the invoker's row after it.  A receive that waited
        for another of its sequence finds its guess wrong against the row as
        its statement's snapshot saw it (before that commit); the row as it is
        now is then read and locked (a second statement), and when the guess
        holds for it, the receipt is sent again, and its snapshot sees that:
        three statements.  The receives of one sequence seldom overlap, and
        the common receive's statement is the cheaper for leaving that read
        out (see ``statements._RECEIVE_IN_ORDER``).  (With ``answering`` the lock
        is still a statement of its own: the statements after the receipt
        read what it wrote.)

        None when the guess was wrong (a gap, a duplicate, the last message,
        a closed or unknown sequence): nothing written, the row locked and
        read (a statement after the receipt's; the caller's read of it then
        costs no round trip), and the caller records the message the general
        way.
        Otherwise the sequence as it was before this message (for the
        caller's checks, which roll the transaction back if they refuse it),
        and whether the message was taken.

        ``answering``: the arguments of ``rms_messages.mark_answered_acknowledging`` the caller
        makes next when the message is taken (a reply whose record consumes it).  Their
        statements then go in this round trip, run only if the message was taken, and that
        call takes their row from :attr:`ran_ahead`: the reply's record costs a round
        trip less on the caller's path (see :meth:`_receive_ahead`).  ``acknowledging``: those
        of ``rms_messages.acknowledge_sequence`` (without ``now``) the caller makes when the
        message is received (the acknowledgement that rode on it), likewise: a round trip less
        for the service's receipt of a request.  ``commits`` (with ``answering``): see
        :meth:`_receive_ahead`."""
        if number < 2 or sequence_id in self.held_rmd:
            return None
        if not self.d.for_update:
            return self._receive_in_order_here(sequence_id, number, now, take)
        if not take:  # PostgreSQL's round trip is the lock's: the general way reads the row in it
            return None
        if answering is not None and answering[2] and self.d.writable_cte and self.undo is None:
            message_id, acked, ranges, keep = answering
            merged = api.AckRanges.from_ranges(ranges)
            return self._receive_ahead(
                sequence_id, number, now, ahead_key("answered", message_id, acked, merged.ranges, keep),
                _RECEIVED_AND_TAKEN, lambda t, gate, more: self.rms_messages.answering_statements(  # type: ignore[attr-defined]
                    message_id, acked, merged, t, keep, gate=gate, more=more), commits=commits)
        if acknowledging is not None:
            acked, ranges, keep = acknowledging
            merged = api.AckRanges.from_ranges(ranges)
            if self.rms_messages.acknowledges_in_one(acked, merged):  # type: ignore[attr-defined]
                return self._receive_ahead(
                    sequence_id, number, now, ahead_key("acknowledged", acked, merged.ranges, keep),
                    _RECEIVED, lambda t, gate, more: self.rms_messages.acknowledging_statements(  # type: ignore[attr-defined]
                        acked, merged, t, keep, gate=gate, more=more))
        before = self._hold_for_receipt(sequence_id, number)
        params = _receipt_and_take_params(sequence_id, number, _now(now), before)
        row = self.one(_RECEIVE_IN_ORDER, params)
        if row is None:  # guessed wrong against the row as the statement's snapshot saw it: the
            held = self.rmd.get(sequence_id)  # row as it is now, locked and held for the caller's read
            if held is None or held.closed or held.terminated or held.last_number is not None \
                    or api.format_ranges(held.received) != before:
                return None
            # it waited for another receive of the sequence, and the row as it is now takes the
            # receipt: the row is held now, and a new statement's snapshot sees it as it is
            row = self.one(_RECEIVE_IN_ORDER, params)
            if row is None:
                return None
        seq = self.held_rmd[sequence_id] = _rmd(row[:-1])
        self._wrote = True
        return replace(seq, received=api.parse_ranges(before)), self.note_take(sequence_id, number, bool(row[-1]))

    @property
    def receives_at_commit(self) -> bool:
        """On a PostgreSQL branch of a global transaction whose session sends it by SQL (so its
        writes can ride to its commit: ``LazyBeginConnection.ride``), keeping no undo image."""
        return self._global is not None and bool(self.d.for_update) and self.d.writable_cte \
            and self.undo is None and not self.d.payload_apart and hasattr(self.conn, "ride")

    def foresee_sequence(self, seq: RmsSequence) -> None:
        if not self.receives_at_commit or seq.key in self.held_rms:
            return
        self.lock(RANK_RMS, seq.key)
        self.held_rms[seq.key] = seq  # checked by receive_at_commit's statement before the commit
        self.foreseen[seq.key] = seq.next_number

    def receive_at_commit(self, sequence_id: str, number: int, *, now: float | None = None,
                          acknowledging: tuple[str, Sequence[tuple[int, int]], bool] | None = None,
                          reply: str | None = None) -> bool:
        """On PostgreSQL (:attr:`receives_at_commit`): the RMD row locked, the receipt in order
        (:data:`_RECEIVE_IN_ORDER_NOTED`) and the acknowledgement's two statements
        (``rms_messages.acknowledging_statements``, written only if the message was taken),
        whose last checks the guesses (``statements._receipt_checked``), in front of the writes
        riding to the commit (:meth:`write_first`): with the COMMIT, no round trip of their own.
        The rows are locked in the store's lock order there (RMD, invoker, RMS), after the
        application's own rows.  A one-way message (no ``acknowledging``, no ``reply``): the
        receipt and take alone, one statement that checks itself
        (:data:`_RECEIVE_IN_ORDER_CHECKED`), as the first statement of the general way's
        receipt (:meth:`receive_in_order`) is sent: no lock ahead of it."""
        if acknowledging is None:
            if not self.receives_at_commit or number < 2 or sequence_id in self.held_rmd:
                return False
            before = self._hold_for_receipt(sequence_id, number)
            self.write_first([(_RECEIVE_IN_ORDER_CHECKED,
                               _receipt_and_take_params(sequence_id, number, _now(now), before))])
            return True
        assert reply is not None
        acked, ranges, keep = acknowledging
        merged = api.AckRanges.from_ranges(ranges)
        if not self.receives_at_commit or number < 2 or not merged.ranges or sequence_id in self.held_rmd:
            return False
        before = self._hold_for_receipt(sequence_id, number)
        self.lock(RANK_RMS, ("sequence_id", acked))
        t = _now(now)
        # an enqueue that took its number from the row foreseen (not by a statement of its own)
        numbered = reply in self._numbered and reply not in self.took_number
        checked, values = _receipt_checked(reply, self.foreseen.get(reply) if numbered else None)
        statements = [("SELECT 1 FROM rmd_sequence WHERE sequence_id = ? FOR UPDATE", (sequence_id,)),
                      (_RECEIVE_IN_ORDER_NOTED, _receipt_and_take_params(sequence_id, number, t, before)),
                      *self.rms_messages.acknowledging_statements(  # type: ignore[attr-defined]
                          acked, merged, t, keep, gate=_RECEIVED_AND_TAKEN, more=(checked, "", values))]
        self.write_first(statements)
        return True

    def held_rows(self, sequence_id: str, key: str) -> tuple[RmdSequence | None, RmsSequence | None]:
        return self.held_rmd.get(sequence_id), self.held_rms.get(key)

    def _hold_for_receipt(self, sequence_id: str, number: int) -> str:
        """The bookkeeping before a receipt in order of ``number``: its sequence's RMD and
        invoker rows locked in the lock order, their keys captured; the received prefix the
        receipt guesses (1..number-1)."""
        api.check_number(number)
        self.lock(RANK_RMD, sequence_id)
        self.lock(RANK_INVOKER, sequence_id)
        self.capture_key("rmd_sequence", sequence_id)
        self.capture_key("invoker_sequence", sequence_id)
        return _prefix(number - 1)

    def _receive_ahead(self, sequence_id: str, number: int, now: float | None, key: tuple[Any, ...], gate: str,
                       statements: Callable[[float, str, tuple[str, str, Sequence[Any]]], _Statements],
                       commits: tuple[str, str | None, tuple[str, ...]] | None = None
                       ) -> tuple[RmdSequence, bool] | None:
        """:meth:`receive_in_order` with a store call's statements after it in the same round trip
        (``statements(now, gate, more)``, kept in :attr:`ran_ahead` under ``key``): the RMD row
        locked, the receipt written (its outcome in a transaction-local setting), then the call's
        statements (a source sequence locked after the RMD row and the invoker's, as the lock
        order wants), each doing nothing unless ``gate`` holds; the last also reads the RMD row
        (as this transaction now holds it) and the outcome.  What the caller does between the
        receipt and the call (its checks, which roll the transaction back if they refuse the
        message) reads nothing the call wrote.

        ``commits`` (a reply's record: ``answering`` given), on a transaction that has sent
        nothing yet: the round trip commits it too, returning before its WAL flush (as
        :meth:`wait_for_disk_later`), when all went as the caller expects -- the reply received
        and taken, its request marked answered with the acknowledgement applied, its sequence's
        Close or Terminate not made due by it (no last message known), and the caller's checks
        of the sequence passed: ``commits`` is (the RM version it speaks, the principal sending
        or None, the AcksTo addresses that take no acknowledgement request).  The caller then
        has nothing left to write, and its COMMIT is no round trip.  Otherwise the round trip's
        last statement fails on purpose (a division by zero: :data:`_DECLINED`), PostgreSQL
        rolls its query string's transaction back whole, and :class:`~.api.CommitDeclined` says
        so: the caller's receipt goes again without ``commits`` (a round trip more, only then)."""
        late = getattr(self._store, "late_commits", None)  # (PostgreSQL's: SQLite has no such round trip)
        alone = (commits is not None and late is not None and self.lazy_begin and not self.begun
                 and self.undo is None and not self._wrote and not self._numbered)
        before = self._hold_for_receipt(sequence_id, number)
        t = _now(now)
        received: str = "current_setting('wsrm.received')"
        checks: tuple[Any, ...] = ()
        if alone:
            assert commits is not None
            received, checks = _committed_if_expected(commits)
        after = statements(t, gate, (f", {_cols(_RMD_COLS, 'rd')}, {received}",
                                     " LEFT JOIN rmd_sequence rd ON rd.sequence_id = ?", (*checks, sequence_id)))
        then = [(_RECEIVE_IN_ORDER_NOTED, _receipt_and_take_params(sequence_id, number, t, before)), *after]
        lock = "SELECT 1 FROM rmd_sequence WHERE sequence_id = ? FOR UPDATE"
        if alone:
            assert late is not None
            began_with, self.begin_with = self.begin_with, "SET LOCAL synchronous_commit TO OFF; "
            self.next_write_commits()
            late_number = late.start()  # a commit that returns before its flush (see late_commits)
            try:
                cur = self.execute(lock, (sequence_id,), then=then, declined=_DECLINED)
            finally:
                late.returned(late_number)
                self.begin_with = began_with
                self.commits_alone = False
            if cur is None:  # declined: nothing of it happened; the caller goes again without commits
                raise api.CommitDeclined(f"message {number} of {sequence_id}: its record cannot commit "
                                         "in its receipt's round trip")
            self._commit_seq = late_number  # for wait_for_disk
        else:
            cur = self.execute(lock, (sequence_id,), then=then)
        row = cur.fetchone()
        cur.close()
        width = len(row) - len(_RMD_COLS) - 1
        outcome = int(row[-1])
        if row[width] is None:  # no such sequence
            return None
        seq = self.held_rmd[sequence_id] = _rmd(row[width:-1])
        if outcome < 0:  # guessed wrong: the row as it is, held for the caller's read; nothing else ran
            return None
        self._wrote = True
        if outcome or gate == _RECEIVED:  # the call's statements ran
            self.ran_ahead[key] = row[:width]
        return replace(seq, received=api.parse_ranges(before)), self.note_take(sequence_id, number, bool(outcome))

    def _receive_in_order_here(self, sequence_id: str, number: int, now: float | None,
                               take: bool = True) -> tuple[RmdSequence, bool] | None:
        """:meth:`receive_in_order` where the transaction holds the whole file (SQLite): no lock to
        take first, so the guess is the receipt's UPDATE itself (it changes the row only if the
        sequence has received exactly 1..number-1 and is open, and returns it as written), and
        the take follows: two statements where reading the row first made three.  None, and
        nothing written, when the guess was wrong (the caller reads the row and goes the
        general way: one statement more than before, for a duplicate, a gap or a closing
        sequence)."""
        api.check_number(number)
        self.lock(RANK_RMD, sequence_id)
        self.capture_key("rmd_sequence", sequence_id)
        before = _prefix(number - 1)
        rows = self.all(
            f"UPDATE rmd_sequence SET {_RECEIPT_SET} WHERE sequence_id = ? AND received = ? "
            f"AND NOT closed AND NOT terminated AND last_number IS NULL RETURNING {_cols(_RMD_COLS)}",
            _receipt_params(sequence_id, number, _now(now), before))
        if not rows:
            return None
        self._wrote = True
        seq = self.held_rmd[sequence_id] = _rmd(rows[0])
        # (with_received: dataclasses.replace walked the row's 14 fields, 15 Python calls a message)
        return seq.with_received(api.parse_ranges(before)), take and self.invoker.take_next(sequence_id, number)

    def note_take(self, sequence_id: str, number: int, taken: bool) -> bool:
        """After a take: the invoker row as this transaction now holds it (or forgets it)."""
        if taken:
            self.held_invoker[sequence_id] = (api.parse_ranges(_prefix(number)), number)
        else:
            self.held_invoker.pop(sequence_id, None)
        return taken

    def lock(self, rank: int, key: Any) -> None:
        """Lock-order bookkeeping; the row lock itself is the statement's FOR UPDATE."""
        self._check_open()
        if self._check_lock_order(rank, key):
            self._note_lock(rank, key)

    @property
    def has_changes(self) -> bool:
        return self._wrote

    supports_savepoints = True

    @property
    def untouched(self) -> bool:
        return self.conn is None and not self._closed  # deferred, no statement yet

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """SQL SAVEPOINT (SQLite and PostgreSQL alike); the undo capture is rewound with it.  Released
        when its body returns, except on SQLite, where it stays open until the transaction ends
        (``Dialect.savepoints_left_open``: a statement less in the store's file)."""
        self._check_open()
        self._savepoints += 1
        name = f"wsrm_sp{self._savepoints}"
        undo = dict(self.undo) if self.undo is not None else None
        numbered, took, answered = dict(self._numbered), set(self.took_number), dict(self.ran_ahead)
        self.commits_alone = False  # a savepoint needs the transaction's BEGIN
        self.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            if not self._closed and self.failed is None:
                self.execute(f"ROLLBACK TO SAVEPOINT {name}")
                self.execute(f"RELEASE SAVEPOINT {name}")
                self.undo = undo
                self._numbered = numbered  # a flush inside the savepoint is undone too
                self.took_number = took
                self.ran_ahead = answered  # a mark run ahead inside the savepoint is undone
                self._forget_held()  # its writes are undone, and the locks it took released
            raise
        if not self.d.savepoints_left_open:  # (SQLite: open until the COMMIT; see the dialect)
            self.execute(f"RELEASE SAVEPOINT {name}")

    def _forget_held(self) -> None:
        """Drop every copy of a held row (and every message read ahead): they may be stale now."""
        self.held_invoker.clear()
        self.held_rmd.clear()
        self.held_rms.clear()
        self.shared_rms.clear()
        self.read_ahead.clear()

    def hand_out(self, key: str, number: int, last: bool) -> None:
        """Remember that enqueue handed out ``number`` on sequence ``key`` (written by :meth:`flush`)."""
        self.commits_alone = False  # the number's write (flush) and the enqueue's commit together
        _, was_last = self._numbered.get(key, (0, False))
        self._numbered[key] = (number, last or was_last)

    def next_write_commits(self) -> None:
        """On a store whose BEGIN waits for the first write (PostgreSQL's local transactions): that
        write is sent without it, so PostgreSQL runs it, with the transaction's settings
        (:attr:`begin_with`), in the implicit transaction of its query string and commits it as
        it ends, and :meth:`commit` has nothing left to send for it.  Only for the transaction's
        first write: after one (or an enqueue's number handed out, written at the commit) it
        changes nothing."""
        if self.lazy_begin and not self.begun and self.undo is None and not self._wrote and not self._numbered:
            self.commits_alone = True

    def wait_for_disk_later(self) -> None:
        self.returns_before_disk = True  # read by the SQLite and PostgreSQL stores' commits

    def wait_for_disk(self) -> None:
        wait = getattr(self._store, "_wait_for_disk", None)  # the others' commits waited already
        if wait is not None:
            wait(self)

    def make_durable(self) -> None:
        self.waits_for_disk = True
        if not self.begin_with:
            return
        self.begin_with = ""
        if self.begun:
            self.execute("SET LOCAL synchronous_commit TO ON")

    def flush(self) -> None:
        """Write the sequence rows' highest numbers that enqueue only remembered.

        Writing the row on every enqueue, in a transaction that enqueues
        thousands of messages (a Spark partition), leaves one row version per
        message behind, all alive until the commit: each later lookup of the
        row walks them, and the partition's enqueues take quadratic time.  The
        stores flush before they commit or prepare, and a statement that
        reads the sequence table flushes first.  On a global transaction's
        branch the writes ride on its COMMIT (:meth:`write_later`).
        """
        if not self._numbered:  # the common case: nothing enqueued (no new dict for it)
            return
        pending, self._numbered = self._numbered, {}
        for key, (number, last) in pending.items():  # their outcome is known: they may ride
            if last:
                self.write_later("UPDATE rms_sequence SET highest_number = ?, last_message = TRUE, "
                                 "last_number = ? WHERE seq_key = ?", (number, number, key))
            else:
                self.write_later("UPDATE rms_sequence SET highest_number = ? WHERE seq_key = ?", (number, key))

    # -- undo capture -------------------------------------------------------------------

    def capture(self, table: str, where: str, params: Sequence[Any]) -> None:
        """Keep the before-image of the rows ``where`` selects (first write wins)."""
        if self.undo is None:
            return
        cur = self.execute(f"SELECT * FROM {table} WHERE {where}", params)
        names = [c[0] for c in cur.description]
        pk_idx = [names.index(c) for c in PRIMARY_KEYS[table]]
        for row in cur.fetchall():
            key = (table, tuple(row[i] for i in pk_idx))
            if key not in self.undo:
                self.undo[key] = dict(zip(names, row, strict=True))
        cur.close()

    def capture_key(self, table: str, *pk: Any) -> None:
        """Before inserting or changing one row by key: its image, or "absent".

        Every write of a sequence row comes through here first, so this is
        also where the transaction forgets the copy it holds of that row.
        """
        if table == "rms_sequence":
            self.held_rms.pop(pk[0], None)
            if self.shared_rms:  # written next: held against every writer from then on
                self.shared_rms.discard(pk[0])
        elif table == "rmd_sequence":
            self.held_rmd.pop(pk[0], None)
        if self.undo is None or (table, pk) in self.undo:
            return
        self.capture(table, " AND ".join(f"{c} = ?" for c in PRIMARY_KEYS[table]), pk)
        self.undo.setdefault((table, pk), None)

    # -- ending -----------------------------------------------------------------------------

    def commit(self) -> None:
        api.refuse_if_global(self)
        self._refuse_commit_if_failed()
        self._check_open()
        if self.ran_ahead:  # written ahead and taken by no one: never committed unaccounted
            self.rollback()
            raise api.StoreError(f"store calls run ahead were never taken ({list(self.ran_ahead)}): "
                                 "rolled back")
        self.flush()
        self._store._finish(self, commit=True)

    def rollback(self) -> None:
        if self._closed:
            return
        api.refuse_if_global(self)
        self._store._finish(self, commit=False)

    def mark_closed(self) -> None:
        self._closed = True

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._global is not None:
            if exc_type is not None:  # a branch left normally: the TM ends it, nothing to do here
                api.exit_global(self, exc_type)
            return
        super().__exit__(exc_type, exc, tb)


#: COPY's binary format: the signature, no flags, no header extension; and its trailer
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_NULL = struct.pack(">i", -1)


def _codec(encoding: str) -> str:
    """Python's name of a PostgreSQL client encoding (psycopg2's table)."""
    from psycopg2 import extensions as ext  # the PostgreSQL store's driver (SQLite has no COPY)

    return str(ext.encodings.get(encoding, "utf-8"))


def _copy_pieces(row: Sequence[Any], types: Sequence[str], encoding: str) -> list[bytes]:
    """One row of COPY's binary format, as pieces (a large payload is one of them, not copied)."""
    codec = _codec(encoding)
    head = [_COPY_HEADER, struct.pack(">h", len(row))]
    pieces: list[bytes] = []
    for value, kind in zip(row, types, strict=True):
        if value is None:
            head.append(_NULL)
            continue
        if kind == "text":
            data = value.encode(codec)
        elif kind == "bytea":
            data = value if isinstance(value, bytes) else bytes(value)
        elif kind == "int8":
            data = struct.pack(">q", int(value))
        elif kind == "int4":
            data = struct.pack(">i", int(value))
        elif kind == "float8":
            data = struct.pack(">d", float(value))
        elif kind == "bool":
            data = b"\x01" if value else b"\x00"
        else:
            raise ValueError(f"no binary COPY form for a column of type {kind!r}")
        head.append(struct.pack(">i", len(data)))
        if len(data) > 4096:  # sent as it is: no copy of it joined with the rest
            pieces += [b"".join(head), data]
            head = []
        else:
            head.append(data)
    head.append(_COPY_TRAILER)
    return [*pieces, b"".join(head)]


class _Pieces:
    """A file for psycopg2's ``copy_expert`` that hands over prepared pieces, one per read."""

    __slots__ = ("_pieces",)

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces[::-1]

    def read(self, size: int = -1) -> bytes:
        return self._pieces.pop() if self._pieces else b""


class _Chunks:
    """A file for psycopg2's ``copy_expert`` that keeps what COPY TO sends, a message a chunk."""

    __slots__ = ("received",)

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.received.append(data)
        return len(data)


def _copy_rows(chunks: list[bytes]) -> list[list[bytes]]:
    """The rows of COPY's binary format (their fields' bytes; a NULL as b"").  PostgreSQL sends
    each row in a message of its own (the header with the first, the trailer alone): a field is
    sliced out of its message, copied once.  Messages cut otherwise are joined first."""
    try:
        rows: list[list[bytes]] = []
        for index, chunk in enumerate(chunks):
            if _copy_chunk(chunk, rows, first=index == 0):
                return rows
        raise ValueError("COPY's output ended without its trailer")
    except (struct.error, IndexError):
        rows = []
        if len(chunks) > 1 and _copy_chunk(b"".join(chunks), rows, first=True):
            return rows
        raise ValueError("COPY's binary output could not be read") from None


def _copy_chunk(data: bytes, rows: list[list[bytes]], *, first: bool) -> bool:
    """Append the rows of one message of COPY's binary output to ``rows``; True at the trailer.
    A field that runs past the message raises IndexError."""
    at = 0
    if first:
        if data[:11] != _COPY_HEADER[:11]:
            raise ValueError("not COPY's binary format")
        at = 19 + struct.unpack_from(">i", data, 15)[0]
    view = memoryview(data)
    while at < len(data):
        (count,) = struct.unpack_from(">h", data, at)
        at += 2
        if count < 0:
            return True
        fields = []
        for _ in range(count):
            (size,) = struct.unpack_from(">i", data, at)
            at += 4
            if size < 0:
                fields.append(b"")
                continue
            if at + size > len(data):
                raise IndexError("a field runs past its message")
            fields.append(bytes(view[at:at + size]))
            at += size
        rows.append(fields)
    return False


def _opens_transaction(sql: str) -> bool:
    """Must ``sql`` run inside the transaction?  All but a plain read: writes, row locks, savepoints."""
    return not sql.lstrip()[:6].upper() == "SELECT" or " FOR " in sql


def _in_list(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


def apply_undo(tx: SqlTransaction, undo: UndoLog) -> None:
    """Put every row back as it was before the branch (SQLite XA rollback)."""
    for (table, pk), image in undo.items():
        cols = PRIMARY_KEYS[table]
        tx.write(f"DELETE FROM {table} WHERE {' AND '.join(f'{c} = ?' for c in cols)}", pk)
        if image is not None:
            names = list(image)
            tx.write(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({_in_list(names)})",
                     [image[n] for n in names])

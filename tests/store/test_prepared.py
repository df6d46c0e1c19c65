"""The PostgreSQL store prepares the statements it sends again on a session, and never loses a
transaction to a statement that cannot be prepared or to a session that lost its statements."""

from __future__ import annotations

import math
from decimal import Decimal

import psycopg2.extensions as ext
import pytest

from wsrm_plugin.store import StorageManager, StoreError, open_store

from .conftest import KINDS
from .test_managers import new_rmd

pytestmark = pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)


def _prepared_on(tx) -> list[str]:
    with tx.conn.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cur.fetchall()]


def test_a_statement_sent_again_on_a_session_is_prepared_there_and_reads_the_same(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    seen = []
    for number in (1, 2, 3):
        with store.begin() as tx:  # the pool gives the same session back
            tx.rmd.record_received("s1", number)
            seen.append(list(tx.rmd.get("s1").received.ranges))
            prepared = _prepared_on(tx)
    assert seen == [[(1, 1)], [(1, 2)], [(1, 3)]]
    assert any("UPDATE rmd_sequence" in text and "$1" in text for text in prepared), prepared
    assert store.statements is not None and store.statements.prepared >= 1


def test_a_statement_postgresql_cannot_prepare_is_sent_as_text_and_its_transaction_goes_on(
        store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    unpreparable = "SELECT ? IS NULL"  # the type of the parameter cannot be inferred
    for _ in range(3):
        with store.begin() as tx:
            tx.rmd.get("s1")  # in a transaction: the failed PREPARE must not abort it
            assert tx.one(unpreparable, (None,)) == (True,)
            assert tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
            tx.rmd.record_received("s1", 1)
        with store.begin() as tx:  # outside a transaction (a plain read): nothing to abort
            assert tx.one(unpreparable, (1,)) == (False,)
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 1)]
        assert not any("IS NULL" in text for text in _prepared_on(tx))


def test_savepoints_are_sent_as_text_and_a_batch_of_them_aborts_nothing(store: StorageManager) -> None:
    """A savepoint's statement repeats on a session (``SAVEPOINT wsrm_sp1`` for every batched
    delivery): PostgreSQL cannot prepare it, and the attempt once aborted its transaction
    silently (the SAVEPOINT that guards a PREPARE was sent in one string with it, so a syntax
    error in the PREPARE kept it from being set)."""
    with store.begin() as tx:
        new_rmd(tx)
    for number in (1, 2, 3):
        with store.begin() as tx:
            tx.rmd.get("s1")
            with tx.savepoint():
                tx.rmd.record_received("s1", number)
            assert tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 3)]
        assert not any("AS SAVEPOINT" in text for text in _prepared_on(tx))


def test_a_session_that_lost_its_statements_fails_one_transaction_then_prepares_again(
        store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    for number in (1, 2):
        with store.begin() as tx:
            tx.rmd.record_received("s1", number)
    with store.begin() as tx:
        assert _prepared_on(tx)
        with tx.conn.cursor() as cur:
            cur.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does behind the store's back
    with pytest.raises(StoreError), store.begin() as tx:
        tx.rmd.record_received("s1", 3)
    for number in (3, 4):
        with store.begin() as tx:
            tx.rmd.record_received("s1", number)
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 4)]


def _as_url(store_url: str) -> str:
    """``postgresql://...`` for the test's store (given as a libpq DSN, which has no query string)."""
    dsn = store_url.removeprefix("postgresql:")
    if dsn.startswith("//"):
        return store_url
    p = ext.parse_dsn(dsn)
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


def test_prepared_statements_can_be_turned_off_in_the_url(store_url) -> None:
    url = _as_url(store_url())
    store = open_store(url + ("&" if "?" in url else "?") + "prepare_statements=0")
    try:
        assert store.statements is None
        with store.begin() as tx:
            new_rmd(tx)
        with store.begin() as tx:
            tx.rmd.record_received("s1", 1)
            tx.rmd.record_received("s1", 2)
            assert _prepared_on(tx) == []
    finally:
        store.close()
    with pytest.raises(ValueError, match="prepare_statements='maybe'.* is not 0 or 1"):
        open_store(url + ("&" if "?" in url else "?") + "prepare_statements=maybe")


def test_a_branchs_first_statement_is_prepared_and_an_unpreparable_one_aborts_nothing(
        store: StorageManager, tmp_path) -> None:
    """In an XA branch the BEGIN waits for the first statement (txmanager.lazy_begin): the
    statement is prepared outside any transaction (it was sent as text every time, before),
    and a PREPARE PostgreSQL refuses there leaves the branch whole."""
    from txmanager import TransactionManager

    with store.begin() as tx:
        new_rmd(tx)
    tm = TransactionManager(node="preparedtest", log=tmp_path / "tm.log")
    unpreparable = "SELECT ? IS NULL"
    try:
        for number in (1, 2, 3):
            with tm.transaction(), store.begin(xa=tm) as tx:
                assert tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE  # nothing sent yet
                assert tx.rmd.get("s1") is not None  # the branch's first statement
                tx.rmd.record_received("s1", number)
                prepared = _prepared_on(tx)
        assert any(" AS SELECT " in text and "FROM rmd_sequence" in text for text in prepared), prepared
        for number in (4, 5, 6):
            with tm.transaction(), store.begin(xa=tm) as tx:
                assert tx.one(unpreparable, (None,)) == (True,)  # the branch's first statement
                tx.rmd.record_received("s1", number)
                assert tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
                prepared = _prepared_on(tx)
    finally:
        tm.close()
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 6)]
    assert not any("IS NULL" in text for text in prepared)


def test_the_senders_claim_is_prepared_with_its_setting_in_front_and_reads_few_rows_at_a_backlog(
        store: StorageManager) -> None:
    """The sender's claim goes after ``SET LOCAL enable_bitmapscan TO off`` in its query string
    (see ``rms._ordered_scan``): it was sent as text every time, planned at each claim (0.4-1.1
    ms of the server's CPU).  It is prepared now, the setting still in front of its every
    EXECUTE, so each of its plans (the custom ones, then the generic one) is made with it off:
    at a backlog of 4,000 each of ten claims on the session reads about the batch's rows (a
    bitmap scan read every due message: 8,039 rows touched, the setting left out), and its plans are the prepared statement's."""
    from .test_backlog import BATCH, LARGE, _backlog, _rows_touched

    _backlog(store, LARGE)
    touched = [_rows_touched(store, lambda tx: tx.rms_messages.due_messages(limit=BATCH, per_sequence=BATCH))
               for _ in range(10)]
    with store.begin() as tx, tx.conn.cursor() as cur:
        cur.execute("SELECT generic_plans + custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%CROSS JOIN LATERAL%'")
        plans = [row[0] for row in cur.fetchall()]
    assert plans and sum(plans) >= 8, plans  # every claim but the first ran the prepared statement
    assert max(touched) < LARGE // 4, touched  # about the batch's rows (200-250), not the backlog's


def test_an_executes_double_precision_and_bigint_arguments_go_as_text_and_read_back_exactly(
        store: StorageManager) -> None:
    """Written as psycopg2 writes them, a ``float`` is a ``numeric`` constant in an ``EXECUTE``'s
    text and an ``int`` an ``integer``: PostgreSQL casts and folds each into a constant of the
    parameter's type at every ``EXECUTE`` (about 8 k instructions an argument).  For a
    ``double precision`` or a ``bigint`` parameter they go as quoted text, read by the type's
    own input; the others as before."""
    sql = ("SELECT CAST(? AS double precision), CAST(? AS bigint), CAST(? AS integer), CAST(? AS numeric), "
           "CAST(? AS bigint), CAST(? AS double precision)")
    specials = [0.1 + 0.2, 1e300, 5e-324, -0.0, -1.5, math.inf, -math.inf, math.nan, 1764620000.123456, 3]
    for value in specials:
        params = (value, 2 ** 40, 7, 2.5, 1, -2 ** 62)
        rows = []
        for _ in range(3):  # prepared the second time
            with store.begin() as tx:
                rows.append(tx.one(sql, params))
                sent, arguments = tx._text(sql, params)
        assert sent.startswith("EXECUTE wsrm_"), sent
        written = repr(value) if isinstance(value, float) and math.isfinite(value) else str(value)
        if isinstance(value, float) and not math.isfinite(value):
            written = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(value)]
        assert list(arguments) == [written, str(2 ** 40), 7, 2.5, "1", str(-2 ** 62)], arguments
        for row in rows:
            assert row[1:] == (2 ** 40, 7, Decimal("2.5"), 1, -2 ** 62)
            if value != value:
                assert math.isnan(row[0])
            else:
                assert row[0] == value and math.copysign(1, row[0]) == math.copysign(1, value)


def test_a_parameter_named_again_goes_once_as_text_prepared_and_unprepared(store: StorageManager, store_url) -> None:
    """``?N`` names parameter N again (SQLite's numbering: a bare ``?`` is the one after the
    highest so far): prepared, the ``EXECUTE`` carries each value once; sent as text (its
    first time on a session, or with prepared statements off), psycopg2 gets it repeated."""
    sql = "SELECT ? || '/' || ?, ?1, CAST(? AS bigint) - ?3, ?2"
    params = ("a'b", "%s", 40)
    expected = ("a'b/%s", "a'b", 0, "%s")
    sent = []
    for _ in range(3):  # text, then prepared, then executed
        with store.begin() as tx:
            assert tx.one(sql, params) == expected
            sent.append(tx._text(sql, params))
    text, arguments = sent[-1]
    assert text.startswith("EXECUTE wsrm_") and len(arguments) == 3, sent[-1]
    url = _as_url(store_url())
    plain = open_store(url + ("&" if "?" in url else "?") + "prepare_statements=0")
    try:
        with plain.begin() as tx:
            assert tx.one(sql, params) == expected
            assert _prepared_on(tx) == []
    finally:
        plain.close()


def test_an_executes_ascii_bytea_argument_goes_as_its_text_and_reads_back_the_same_bytes(
        store: StorageManager) -> None:
    """A ``bytea`` argument with ASCII bytes only (and no NUL) goes as its text, each backslash
    doubled, which ``bytea``'s input reads in its escape format: half the characters of
    psycopg2's hex for PostgreSQL's lexer, and no hex decoding.  Any other bytes go as before;
    every value reads back byte for byte."""
    sql = "SELECT CAST(? AS bytea), octet_length(CAST(?1 AS bytea))"
    values = [b"", b"<a/>", b"\\x41", b"\\\\", b"a\\101b", b"it's 100%s", b"\\", b"x\\",
              b"\x01\x1f\x7f", b"\x00a", "caf\u00e9".encode(), b"\xff\xfe", bytearray(b"\\x00 <b/>")]
    for value in values:
        rows = []
        for _ in range(3):  # prepared the second time
            with store.begin() as tx:
                rows.append(tx.one(sql, (value,)))
                sent, arguments = tx._text(sql, (value,))
        assert sent.startswith("EXECUTE wsrm_"), sent
        ascii_text = bytes(value).isascii() and b"\0" not in value
        assert isinstance(arguments[0], str) == ascii_text, (value, arguments)
        if ascii_text:
            assert arguments[0] == bytes(value).decode().replace("\\", "\\\\")
        for row in rows:
            assert (bytes(row[0]), row[1]) == (bytes(value), len(value)), (value, row)

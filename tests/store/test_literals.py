"""The PostgreSQL store writes its plain parameters (numbers, booleans, NULL, plain strings, bytes) into its
statements' text itself, exactly as psycopg2 would, instead of through psycopg2's adapters, whose
``int`` costs about 9 k instructions (see ``wsrm_plugin.store.sql.literals``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import psycopg2.extensions as ext
import pytest

from wsrm_plugin.store import StorageManager
from wsrm_plugin.store.sql.literals import inline

from .conftest import KINDS
from .test_managers import new_rmd, new_rms

pytestmark = pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)

_PLAIN = (int, float, bool, str, bytes)


@pytest.fixture
def adapted() -> Iterator[Counter[str]]:
    """How often psycopg2's own adapters were asked for each plain type (each still adapts)."""
    seen: Counter[str] = Counter()
    kept = {kind: ext.adapters[(kind, ext.ISQLQuote)] for kind in _PLAIN}

    def counting(kind: type, adapter):
        def adapt(value):
            seen[kind.__name__] += 1
            return adapter(value)
        return adapt

    for kind, adapter in kept.items():
        ext.register_adapter(kind, counting(kind, adapter))
    try:
        yield seen
    finally:
        for kind, adapter in kept.items():
            ext.register_adapter(kind, adapter)


def test_the_stores_statements_reach_psycopg2_with_their_plain_parameters_written_in(
        store: StorageManager, adapted: Counter[str]) -> None:
    with store.begin() as tx:
        new_rmd(tx)
        new_rms(tx)
    for number in (1, 2, 3):  # sent again on the session: prepared, then EXECUTEd with the values
        with store.begin() as tx:
            tx.rmd.record_received("s1", number)
            tx.rms_messages.enqueue("k1", b"<it's 100%/>", action="urn:op'%s", soap_version="1.2",
                                    message_id=f"urn:uuid:{number}", send_at=1e12 + number / 4)
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 3)]
        messages = tx.rms_messages.list_for("k1")
    assert [(m.number, m.message_id, m.action) for m in messages] == [
        (n, f"urn:uuid:{n}", "urn:op'%s") for n in (1, 2, 3)]
    assert [m.next_send_at for m in messages] == [1e12 + n / 4 for n in (1, 2, 3)]
    assert {bytes(m.payload) for m in messages} == {b"<it's 100%/>"}
    assert adapted == Counter(), adapted  # the payload (bytes) too: written in as bytea


@pytest.mark.parametrize("strings_on", [True, False], ids=["standard-strings", "backslash-strings"])
def test_what_is_written_in_is_what_psycopg2_would_have_sent(store: StorageManager, strings_on: bool) -> None:
    values = (0, 1, -5, 10 ** 30, 2.5, -2.5, -0.0, 1e-05, 1732977000.123, float("nan"), float("inf"),
              float("-inf"), True, False, None, "", "plain", "it's", "a\\b", "100%", "%s", "%%",
              "ünïcødé", b"\x00bytes", b"", b"it's \\ 100%", bytearray(b"\xff'\x00"), memoryview(b"view"))
    with store.begin() as tx:
        conn = tx.conn
        with conn.cursor() as cur:
            if not strings_on:
                cur.execute("SET standard_conforming_strings TO off")
            template = "SELECT " + ", ".join(["%s"] * len(values))
            text, left = inline(conn, template, values)
            if not strings_on:  # a backslash would be an escape there: such a string is psycopg2's
                assert "a\\b" in left and "'plain'" in text and "plain" not in left
            else:
                assert "a\\b" not in left
            for value in (2.5, True, None, 10 ** 30):
                assert "%s" not in inline(conn, "SELECT %s", (value,))[0]
            for value in (b"\x00bytes", bytearray(b"x")):  # bytea: where a backslash is itself
                assert ("%s" in inline(conn, "SELECT %s", (value,))[0]) is not strings_on
            sent = cur.mogrify(text, left) if left is not None else text.encode()
            assert sent == cur.mogrify(template, values)
            text, left = inline(conn, "SELECT %s, %s", ("NUL\x00in it", 1))
            with pytest.raises(ValueError, match="NUL"):  # psycopg2's refusal, as before
                cur.execute(text, left)
            cur.execute("ROLLBACK")


def test_a_text_with_a_percent_of_its_own_is_left_to_psycopg2(store: StorageManager) -> None:
    with store.begin() as tx:
        assert inline(tx.conn, "SELECT '%%', %s", (1,)) == ("SELECT '%%', %s", (1,))
        assert inline(tx.conn, "SELECT 1", ()) == ("SELECT 1", None)
        assert inline(tx.conn, "SELECT %s", (1, 2)) == ("SELECT %s", (1, 2))  # psycopg2 says what is wrong



class _Asking:
    """A session, counting how often its ``standard_conforming_strings`` is asked for."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.encoding = conn.encoding
        self.server_version = conn.server_version
        self.asked = 0

    def get_parameter_status(self, name: str) -> str:
        self.asked += 1
        return self.conn.get_parameter_status(name)


def test_only_a_literal_with_a_backslash_asks_the_session_how_it_reads_one(store: StorageManager) -> None:
    with store.begin() as tx:
        session = _Asking(tx.conn)
        plain = ("urn:uuid:1", "it's", "100%", 7, -7, 2.5, None, True)
        assert inline(session, "SELECT " + ", ".join(["%s"] * len(plain)), plain)[1] is None
        assert session.asked == 0  # the setting cannot change what these mean
        assert inline(session, "SELECT %s, %s, %s", ("a\\b", 1, "c\\d"))[1] is None
        assert session.asked == 1  # asked once a statement
        assert inline(session, "SELECT %s", (b"\x00bytes",))[1] is None  # '\x..'::bytea
        assert session.asked == 2


def test_a_session_that_sets_its_strings_is_followed_at_once(store: StorageManager) -> None:
    with store.begin() as tx:
        conn = tx.conn
        with conn.cursor() as cur:
            for setting in ("off", "on", "off"):
                cur.execute(f"SET standard_conforming_strings TO {setting}")
                text, left = inline(conn, "SELECT %s, %s", ("a\\'b", "c'd"))
                assert (left is None) is (setting == "on"), (setting, text, left)
                cur.execute(text, left)
                assert cur.fetchone() == ("a\\'b", "c'd")
            cur.execute("ROLLBACK")

"""A message's tree travels with its bytes through a durable store: one parse per message."""

from __future__ import annotations

from lxml import etree

from wsrm_plugin.engine import envelopes
from wsrm_plugin.engine.parsed import ParsedTrees

from .support import ACTION, Recorder, payload, wait_for


def test_bytes_read_back_from_a_store_find_the_tree_of_the_bytes_that_were_stored():
    trees = ParsedTrees()
    payload = b"<a><b>1</b></a>"
    root = etree.fromstring(payload)
    trees.remember(payload, root)
    read_back = bytes(bytearray(payload))  # what a SQL store returns: equal content, another object
    assert read_back is not payload
    assert trees.take(read_back) is root
    assert trees.take(read_back) is None  # handed over once
    assert trees.take(b"<a><b>2</b></a>") is None


def test_a_tree_is_handed_over_with_the_note_of_what_was_read_from_it():
    trees = ParsedTrees()
    payload, root, note = b"<a><b>1</b></a>", etree.Element("a"), object()
    trees.remember(payload, root, note)
    assert trees.take_noted(bytes(bytearray(payload))) == (root, note)
    assert trees.take_noted(payload) is None  # handed over once, note and all
    trees.remember(payload, root)
    assert trees.take_noted(payload) == (root, None)


def test_what_nobody_takes_is_bounded_in_count_and_bytes():
    by_count = ParsedTrees(limit=2)
    for i in range(3):
        by_count.remember(b"<a>%d</a>" % i, etree.Element("a"))
    assert by_count.take(b"<a>0</a>") is None and by_count.take(b"<a>2</a>") is not None
    by_size = ParsedTrees(max_bytes=25)
    first, second = b"<a>" + b"x" * 10 + b"</a>", b"<a>" + b"y" * 10 + b"</a>"
    by_size.remember(first, etree.Element("a"))
    by_size.remember(second, etree.Element("a"))  # 34 bytes together: the oldest goes
    assert by_size.take(first) is None and by_size.take(second) is not None
    by_size.remember(b"<a>" + b"z" * 30 + b"</a>", etree.Element("a"))  # alone over the bound
    assert by_size.take(b"<a>" + b"z" * 30 + b"</a>") is None


def test_a_message_stored_in_sqlite_is_stamped_in_its_bytes(engines, store_for, monkeypatch):
    """The first transmission writes the Sequence header into the bytes the SQLite store gave
    back: neither a parse of them nor the tree the enqueue built (which is not kept for it),
    nor the whole envelope written again."""
    received = Recorder()
    server = engines(store_for("memory", "s"), serve=True, application=received, name="server")
    client = engines(store_for("sqlite", "c"), name="client")
    by_tree = []
    tree_path = envelopes.stamped
    monkeypatch.setattr(envelopes, "stamped", lambda *a: by_tree.append(a) or tree_path(*a))
    for i in range(5):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: received.snapshot() == [f"m{i}" for i in range(5)])
    # (the pieces of the Sequence header are cut once from what the tree path writes)
    assert [data for data, _ in by_tree if b">m" in data] == []

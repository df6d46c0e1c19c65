"""``wsrm resend`` refuses what it cannot do with one clear line, and moves a faulted sequence's messages."""

from __future__ import annotations

from wsrm_plugin.cli import main
from wsrm_plugin.engine.source import SequenceKey
from wsrm_plugin.store import open_store


def _store_with_sequences(path):
    url = f"sqlite:///{path}"
    store = open_store(url)
    with store.begin() as tx:
        for generation, faulted in ((1, True), (2, False)):
            key = SequenceKey("http://127.0.0.1:9/", "k", generation, False).encode()
            tx.rms.create(key, target="http://127.0.0.1:9/", acks_to="http://www.w3.org/2005/08/addressing/anonymous",
                          rm_version="http://docs.oasis-open.org/ws-rx/wsrm/200702",
                          wsa_version="http://www.w3.org/2005/08/addressing")
            for i in range(2):
                tx.rms_messages.enqueue(key, b"<x/>", action="urn:a", soap_version="1.2",
                                        message_id=f"urn:uuid:{generation}-{i}")
            if faulted:
                tx.rms.update(key, faulted=True, fault_reason="no answer to create sequence after 4 attempts")
    store.close()
    return url


def test_resend_says_what_is_wrong_and_moves_a_faulted_sequence(tmp_path, capsys):
    missing = tmp_path / "typo.db"
    assert main(["resend", "--store", f"sqlite:///{missing}", "--all"]) == 2
    assert "no SQLite store at" in capsys.readouterr().err and not missing.exists()

    url = _store_with_sequences(tmp_path / "rm.db")
    assert main(["resend", "--store", url, "--sequence", "urn:uuid:nope"]) == 1
    assert "no source sequence 'urn:uuid:nope'" in capsys.readouterr().err
    live = SequenceKey("http://127.0.0.1:9/", "k", 2, False).encode()
    assert main(["resend", "--store", url, "--sequence", live]) == 1
    assert "is not faulted" in capsys.readouterr().err

    assert main(["status", "--store", url]) == 0
    assert "no answer to create sequence after 4 attempts" in capsys.readouterr().out
    assert main(["resend", "--store", url, "--all"]) == 0
    assert "2 message(s) moved to new sequence" in capsys.readouterr().out
    store = open_store(url)
    try:
        with store.begin() as tx:
            sequences = {s.key: s for s in tx.rms.list_all()}
            assert [s.faulted for s in sequences.values()] == [False, False]
            [new] = [k for k in sequences if k != live]
            assert SequenceKey.decode(new).generation == 3
            assert [m.message_id for m in tx.rms_messages.list_for(new)] == ["urn:uuid:1-0", "urn:uuid:1-1"]
    finally:
        store.close()
    assert main(["resend", "--store", url, "--all"]) == 0
    assert "no faulted sequences" in capsys.readouterr().out

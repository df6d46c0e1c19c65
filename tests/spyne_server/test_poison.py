"""A message the service cannot process: retry cycles, the poison store, operators, SIGKILL.

The method's failure here is a plain exception (a bug, a database down), not
a declared SOAP fault: the message is rolled back and retried in cycles, then
kept in the poison store, never dropped, until ``wsrm poison retry`` or
``discard`` decides.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.engine.support import wait_for
from wsrm_plugin import cli
from wsrm_plugin.store import open_store

from . import service
from .conftest import Envelopes, action, fast_policy
from .test_processes import ROOT, _free_port, _rows, orders_db, processes  # noqa: F401 -- fixtures

#: Two attempts a cycle, three cycles: six attempts, then the poison store.
CYCLES = dict(max_delivery_attempts=2, delivery_retry_delay=0.05, max_retry_cycles=2, retry_cycle_delay=0.3)


def wsrm(*args: str) -> subprocess.CompletedProcess[str]:
    """The real ``wsrm`` command in a process of its own, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "wsrm_plugin.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ})


def poison_list(store_url: str) -> list[dict]:
    done = wsrm("poison", "list", "--store", store_url, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _calls(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _retry_state(store_url: str, item_number: int) -> tuple[int, int] | None:
    store = open_store(store_url)
    try:
        with store.begin() as tx:
            [seq] = [s.sequence_id for s in tx.rmd.list_all()] or [None]
            if seq is None:
                return None
            msg = tx.invoker.get(seq, item_number)
            return None if msg is None else (msg.attempts, msg.cycle)
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_message_that_always_fails_is_kept_as_poison_across_sigkills_and_retried_by_an_operator(
        processes, clients, orders_db, pg_dsn_factory, tmp_path, kind):  # noqa: F811
    store_url = (f"sqlite:///{tmp_path}/server.db" if kind == "sqlite"
                 else f"postgresql:{pg_dsn_factory('poisonstore')}")
    calls = tmp_path / "calls.txt"
    options = dict(store=store_url, port=_free_port(), dsn=orders_db, node="spyne-poison",
                   tm_log=tmp_path / "tm.log", policy=json.dumps({**CYCLES, "retry_cycle_delay": 1.0}),
                   calls_file=calls)
    server = processes(broken="boom", **options)
    client = clients("memory:")
    build = Envelopes(server.url)
    for item in ("a", "boom", "c"):
        client.send(server.url, build("record", item), action=action("record"))

    # the first cycle failed (2 calls, rolled back): its count is in the store, so a SIGKILL now
    # must not give the message a fresh budget
    assert wait_for(lambda: (_retry_state(store_url, 2) or (0, 0))[1] >= 1, timeout=60)
    server.kill()
    before = _calls(calls)
    assert 2 <= before <= 4
    server = processes(broken="boom", **options)
    assert wait_for(lambda: poison_list(store_url), timeout=90)
    [poisoned] = poison_list(store_url)
    assert (poisoned["number"], poisoned["attempts"], poisoned["cycles"], poisoned["sequence_held"]) == (2, 6, 3, True)
    assert "the method has a bug" in poisoned["last_error"]
    # six attempts in all (one more when the kill cut an attempt short): not 2 + 6
    assert 6 <= _calls(calls) <= 7, _calls(calls)
    assert [item for item, _ in _rows(orders_db)] == ["a"]  # "c" is held behind the poison message

    status = wsrm("status", "--store", store_url)
    assert status.returncode == 0 and "poison messages           1" in status.stdout, status.stdout
    metrics = wsrm("status", "--store", store_url, "--prometheus")
    assert "wsrm_poison_messages 1" in metrics.stdout

    # it survives a SIGKILL in the poison store; the restarted server has the method fixed
    server.kill()
    server = processes(**options)
    [still] = poison_list(store_url)
    assert still["id"] == poisoned["id"]
    shown = wsrm("poison", "show", "--store", store_url, poisoned["id"])
    assert shown.returncode == 0 and "boom" in shown.stdout and "attempts:" in shown.stdout

    refused = wsrm("poison", "discard", "--store", store_url, poisoned["id"])
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert [p["id"] for p in poison_list(store_url)] == [poisoned["id"]]
    assert wsrm("poison", "retry", "--store", store_url, poisoned["id"] + "0").returncode != 0  # unknown id

    retried = wsrm("poison", "retry", "--store", store_url, poisoned["id"])
    assert retried.returncode == 0, retried.stderr
    assert wait_for(lambda: len(_rows(orders_db)) >= 3, timeout=60), _rows(orders_db)
    assert [item for item, _ in _rows(orders_db)] == ["a", "boom", "c"]  # once each, in order
    assert poison_list(store_url) == []
    assert wait_for(lambda: client.status().unacked == 0, timeout=60)


@pytest.fixture
def cli_run(capsys):
    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


def test_discard_removes_a_poison_message_only_when_confirmed_and_the_held_sequence_goes_on(
        servers, clients, tmp_path, cli_run, caplog):
    store_url = f"sqlite:///{tmp_path}/server.db"
    service.configure(broken=["boom"])
    server = servers(store_url, fast_policy(**CYCLES))
    client = clients("memory:")
    build = Envelopes(server.url)
    with caplog.at_level(logging.ERROR, logger="wsrm_plugin.engine.invoker"):
        for item in ("a", "boom", "c"):
            client.send(server.url, build("record", item), action=action("record"))
        assert wait_for(lambda: server.engine.status().poisoned == 1, timeout=60)
        # the ERROR is logged just after the move to the poison store commits
        assert wait_for(lambda: any("HELD" in r.getMessage() and "#2" in r.getMessage()
                                    for r in caplog.records), timeout=30), caplog.text
    # hold: the rest of the sequence waits (no message of the store is deliverable), reception goes on
    with server.engine.store.begin() as tx:
        assert tx.invoker.claim_next() is None
    client.send(server.url, build("record", "d"), action=action("record"))
    assert wait_for(lambda: server.engine.status().buffered == 2, timeout=30)
    assert service.recorded() == ["a"]

    [kept] = server.engine.poison_messages()
    code, out, err = cli_run("poison", "list", "--store", store_url)
    assert code == 0 and kept.poison_id in out and "1 poison message(s)" in out
    code, out, err = cli_run("poison", "discard", "--store", store_url, kept.poison_id)
    assert code != 0 and "refusing" in err and "--yes" in err
    assert len(server.engine.poison_messages()) == 1
    code, out, err = cli_run("poison", "discard", "--store", store_url, "no-such-sequence#3", "--yes")
    assert code != 0 and "no poison message" in err
    code, out, err = cli_run("poison", "show", "--store", store_url, "not-an-id")
    assert code != 0 and "not a poison message id" in err
    code, out, err = cli_run("poison", "discard", "--store", store_url, kept.poison_id, "--yes")
    assert code == 0 and "discarded" in out

    assert wait_for(lambda: service.recorded() == ["a", "c", "d"], timeout=30), service.recorded()
    assert server.engine.poison_messages() == []
    assert server.engine.status().poisoned == 0


def test_continue_delivers_the_rest_of_the_sequence_and_the_api_retries_the_poison_message(
        servers, clients, tmp_path):
    failures = []
    service.configure(broken=["boom"])
    server = servers(f"sqlite:///{tmp_path}/server.db",
                     fast_policy(**CYCLES, poison_handling="continue"), on_delivery_failure=failures.append)
    client = clients("memory:")
    build = Envelopes(server.url)
    for item in ("a", "boom", "c"):
        client.send(server.url, build("record", item), action=action("record"))

    assert wait_for(lambda: service.recorded() == ["a", "c"] and failures, timeout=60), service.recorded()
    [kept] = server.engine.poison_messages()
    assert not kept.held and kept.total_attempts == 6 and kept.cycles == 3
    [failure] = failures  # the existing hook is still told, with the message's poison id
    assert failure.poison_id == kept.poison_id and failure.message_number == 2
    assert "the method has a bug" in str(failure.error)

    service.configure()  # the method is fixed
    server.engine.retry_poison(kept.poison_id)
    assert wait_for(lambda: service.recorded() == ["a", "c", "boom"], timeout=30), service.recorded()
    assert server.engine.poison_messages() == []


def test_a_soap12_envelope_given_to_a_soap11_service_is_refused_unacknowledged_and_kept_by_its_source(
        servers, clients, tmp_path):
    """spyne could not read it later, so the front end refuses it (VersionMismatch) before it is
    acknowledged: nothing is accepted that would be lost.  Every copy would be refused the same,
    so the source faults the sequence at once and keeps the message (no fault hook here: it
    stays in the store, for ``wsrm resend`` once the client sends SOAP 1.1)."""
    server = servers(f"sqlite:///{tmp_path}/server.db",
                     fast_policy(**{**CYCLES, "max_retry_cycles": 0}))
    client = clients("memory:", fast_policy(soap_version="1.2"))
    envelope = Envelopes(server.url)("record", "x12").replace(
        b"http://schemas.xmlsoap.org/soap/envelope/", b"http://www.w3.org/2003/05/soap-envelope")
    client.send(server.url, envelope, action=action("record"))

    assert wait_for(lambda: client.status().faulted_sequences == 1, timeout=60), client.status()
    assert client.status().unacked == 1  # still the source's: refused, never acknowledged
    assert server.engine.poison_messages() == []
    assert service.recorded() == []

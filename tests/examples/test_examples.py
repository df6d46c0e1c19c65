"""Every program in examples/ runs as a user would run it, and reports what it promises.

Each example is a subprocess (``python examples/X.py``), checked on its exit
status AND on the counts of its last line, so an example that silently stops
checking, or checks the wrong thing, fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RESULT = re.compile(r"^delivered (\d+) of (\d+), lost (\d+), duplicated (\d+)$")


def run_example(name: str, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, tuple[int, ...]]:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert lines, f"{name} printed nothing; stderr:\n{done.stderr[-3000:]}"
    match = RESULT.match(lines[-1])
    assert match, f"{name}'s last line is not the result line: {lines[-1]!r}\nstderr:\n{done.stderr[-3000:]}"
    return done, tuple(int(n) for n in match.groups())


def assert_exactly_once(name: str, done: subprocess.CompletedProcess, counts: tuple[int, ...], n: int) -> None:
    assert counts == (n, n, 0, 0), f"{name}: {done.stdout}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{name} exited {done.returncode}: {done.stdout}\n{done.stderr[-3000:]}"


def test_in_only_memory_delivers_twenty_messages_in_order_and_terminates():
    done, counts = run_example("in_only_memory.py")
    assert_exactly_once("in_only_memory", done, counts, 20)
    assert "sequence terminated: True; in order: True" in done.stdout


def test_in_only_memory_through_a_lossy_network():
    done, counts = run_example("in_only_memory.py", "--messages", "15", "--loss", "0.3")
    assert_exactly_once("in_only_memory --loss", done, counts, 15)
    dropped = int(re.search(r"proxy: received=\d+ forwarded=\d+ dropped=(\d+)", done.stdout).group(1))
    assert dropped > 0, "the proxy dropped nothing: the run proved nothing about retransmission"


def test_in_out_offer_replies_reach_the_callback_on_the_offered_sequence():
    done, counts = run_example("in_out_offer.py", "--loss", "0.2")
    assert_exactly_once("in_out_offer", done, counts, 20)
    assert "replies correct: True; on the offered sequence: True (1 offered)" in done.stdout
    assert "first reply: '1 x item-1 = 3 EUR'" in done.stdout


def test_make_connection_a_client_behind_a_firewall_polls_for_its_replies():
    done, counts = run_example("make_connection.py", "--calls", "12", "--loss", "0.2")
    assert_exactly_once("make_connection", done, counts, 12)
    assert "replies right: True" in done.stdout and "left in the service's mailbox: 0" in done.stdout
    assert "wsmc/200702/anonymous?id=" in done.stdout


def test_fault_handling_every_fault_reaches_the_client_once():
    done, counts = run_example("fault_handling.py", "--messages", "6", "--attempts", "2", "--loss", "0.2")
    assert_exactly_once("fault_handling", done, counts, 6)
    assert "first fault: 'item-1 is out of stock'" in done.stdout
    assert "service attempts: 12 (2 per call" in done.stdout  # each delivery retried, rolled back, then faulted


def test_an_example_fails_when_its_promise_cannot_be_kept():
    # a service that never gets the messages (every request dropped): the example must say so and exit 1
    done, counts = run_example("in_only_memory.py", "--messages", "3", "--loss", "1.0", "--timeout", "3")
    assert done.returncode == 1, done.stdout
    assert counts == (0, 3, 3, 0)


@pytest.mark.slow(minutes=0.75)
def test_persistent_in_only_survives_client_and_server_crashes(tmp_path):
    done, counts = run_example("persistent_in_only.py", "--messages", "20", "--kills", "4",
                               "--workdir", str(tmp_path / "run"))
    assert_exactly_once("persistent_in_only", done, counts, 20)
    kills = re.findall(r"killed the (client|server) \(SIGKILL\)", done.stdout)
    assert kills == ["client", "server", "client", "server"]


@pytest.mark.slow(minutes=1)
@pytest.mark.postgres
def test_xa_client_server_loses_and_duplicates_nothing_through_six_crashes(pg_dsn_factory):
    done, counts = run_example("xa_client_server.py", "--messages", "30", "--kills", "6",
                               "--dsn", pg_dsn_factory("xaexample"))
    assert_exactly_once("xa_client_server", done, counts, 30)
    assert len(re.findall(r"killed the (?:client|server) \(SIGKILL\)", done.stdout)) == 6
    assert "APPLICATION_CLIENT rows marked sent: 30; transactions left in doubt: 0" in done.stdout

"""Real speculative execution: a straggling partition is copied onto another host, the copy wins.

Spark launches a speculative copy only on a host that runs no attempt of the
task, so this runs a standalone cluster whose two single-core workers are
two loopback addresses (:mod:`tests.spark.cluster`).  The driver runs in its
own process (:mod:`tests.spark.driver_proc`): this pytest process may already
hold the local-mode session of the other Spark tests, and a process has one
SparkContext.

Partition 1's first attempt writes and enqueues 25 rows, then stalls; Spark
sees it run far longer than the other tasks, starts attempt 1 on the other
host, accepts it, and kills the straggler.  The job's event log (written by
Spark itself) and the attempts' own notes show that this really happened;
the client's table and the orders the service recorded are the input rows,
each once, and nothing is left prepared.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from wsrm_plugin.spark import recover_job

from .cluster import StandaloneCluster
from .conftest import ROOT, items
from .test_spark_sink import _deliver

pytestmark = [pytest.mark.slow(minutes=2.5), pytest.mark.timeout(600)]

HOSTS = ("127.0.0.2", "127.0.0.3")
STRAGGLER = 1

SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
    # judge tasks by run time alone: the straggler's row counts are not reported while it stalls
    "spark.speculation.efficiency.enabled": "false",
    # launch the copy at once, without waiting for a "better" locality level first
    "spark.locality.wait": "0s",
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.cores.max": str(len(HOSTS)),
    "spark.driver.host": "127.0.0.1",
    "spark.executorEnv.PYTHONPATH": str(ROOT),
}


def task_events(event_dir: Path) -> list[dict[str, Any]]:
    """Start and end of every task attempt, from the application's Spark event log."""
    logs = [p for p in event_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
    assert len(logs) == 1, f"expected one event log in {event_dir}, found {logs}"
    attempts: dict[int, dict[str, Any]] = {}
    for line in logs[0].read_text().splitlines():
        event = json.loads(line)
        if event["Event"] not in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
            continue
        info = event["Task Info"]
        attempt = attempts.setdefault(info["Task ID"], {"stage": event["Stage ID"]})
        attempt.update(tid=info["Task ID"], partition=info["Index"], attempt=info["Attempt"], host=info["Host"],
                       speculative=info["Speculative"])
        if event["Event"] == "SparkListenerTaskEnd":
            attempt["end"] = event["Task End Reason"]
    return list(attempts.values())


def run_driver(args: list[str], log: Path, timeout: float) -> int:
    """Run :mod:`tests.spark.driver_proc`; on a hang, kill it together with its JVM."""
    with open(log, "wb") as out:
        driver = subprocess.Popen([sys.executable, "-m", "tests.spark.driver_proc", *args], cwd=ROOT,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return driver.wait(timeout=timeout)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def test_a_speculative_copy_on_another_host_wins_and_the_straggler_leaves_nothing(world, tmp_path):
    expected = items(90)
    event_dir = tmp_path / "events"
    event_dir.mkdir()
    conf = {**SPECULATION, "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(event_dir),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
    options = world.options(fault=f"straggle:{STRAGGLER}:0:25", straggleTimeout="120",
                            jobName="speculated")
    with StandaloneCluster(HOSTS, env={"PYTHONPATH": str(ROOT)}, log_dir=tmp_path / "cluster") as cluster:
        driver_log = tmp_path / "driver.log"
        returncode = run_driver([json.dumps(options), str(len(expected)), cluster.master_url,
                                 json.dumps(conf)], driver_log, timeout=400)
        assert returncode == 0, driver_log.read_text(errors="replace")[-4000:]
        # the application is over: its executors (and the straggler, if still alive) must go
        assert cluster.wait_executors_gone(timeout=120), cluster.describe(cluster.executor_processes())
    assert cluster.processes() == [], "the cluster left processes behind"

    # (a) Spark itself says: attempt 0 of the partition ran on one host, a speculative attempt 1
    # on the other one succeeded, and attempt 0 was killed because of it
    events = task_events(event_dir)
    write_stage = max(e["stage"] for e in events)  # after the shuffle of repartition()
    straggler = [e for e in events if e["stage"] == write_stage and e["partition"] == STRAGGLER]
    assert any(e["speculative"] for e in straggler), \
        f"Spark launched no speculative copy of partition {STRAGGLER}: {events}"
    by_attempt = {e["attempt"]: e for e in straggler}
    assert sorted(by_attempt) == [0, 1], straggler
    first, copy = by_attempt[0], by_attempt[1]
    assert copy["speculative"] and not first["speculative"]
    assert {first["host"], copy["host"]} == set(HOSTS), straggler
    assert copy["end"]["Reason"] == "Success", copy
    # the straggler's end is in the event log only if it came before the application's end (the
    # driver may stop first); the executor's log says it was killed because the copy succeeded
    assert first.get("end", {"Reason": "TaskKilled"})["Reason"] == "TaskKilled", first
    kill = f"(TID {first['tid']}), interruptThread: true, reason: another attempt succeeded"
    executor_logs = "".join(p.read_text(errors="replace")
                            for p in (tmp_path / "cluster").glob("worker-*/apps/*/*/stderr"))
    assert kill in executor_logs, f"no kill of the straggler for the copy's success: {kill}"

    # ... and so do the attempts themselves: the straggler stalled with rows written, never woke
    # up nor prepared, and the driver committed the copy
    trace = Path(world.marker).read_text()
    assert f"write p{STRAGGLER} a0 on {first['host']}" in trace, trace
    assert f"write p{STRAGGLER} a1 on {copy['host']}" in trace, trace
    assert f"straggle p{STRAGGLER} a0 waits after 25 rows" in trace, trace
    assert f"prepared p{STRAGGLER} a1" in trace and f"prepared p{STRAGGLER} a0" not in trace, trace
    assert "woke" not in trace, trace
    accepted = [line.split()[1:3] for line in trace.splitlines() if line.startswith("accepted ")]
    assert sorted(p for p, _ in accepted) == ["p0", "p1", "p2"], trace
    assert [f"p{STRAGGLER}", "a1"] in accepted, trace

    # (c) the killed straggler's work died with its Python worker: nothing to roll back, and a
    # recovery scan of the job finds nothing of it either
    assert world.prepared() == []
    recovered = recover_job(log_path=world.log, store=world.store, database=world.client_db,
                            job="speculated", node="sparktest")
    assert (recovered.committed, recovered.rolled_back, recovered.left_to_recovery) == ([], [], [])

    # (b) the rows and the service's recorded orders are exactly the input, each once
    _deliver(world, expected)

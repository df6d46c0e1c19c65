"""Spark jobs that write rows and send one reliable SOAP message per row, under failures.

In every case the client's table and the orders the service recorded in its
own database are exactly the input rows, each once, and nothing is left
prepared.  Spark runs in local mode (``local[2,3]``: 3 attempts per task);
the service is a reliable spyne OrderService on loopback; PostgreSQL is real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from wsrm_plugin.spark import Sender

from .conftest import FAST, ROOT, items

pytestmark = pytest.mark.timeout(300)


def _deliver(world, expected: list[str]) -> None:
    """Run the long-running sender until everything is acknowledged, then compare both sides."""
    from wsrm_plugin.engine import RMPolicy

    with Sender(world.store, RMPolicy(**FAST)) as sender:
        assert sender.wait_until_idle(timeout=120), sender.progress()
    assert sorted(world.sent()) == sorted(expected)
    assert sorted(world.wait_recorded(len(expected))) == sorted(expected)
    assert world.prepared() == []


def test_a_task_failing_midway_on_its_first_attempt_is_retried_and_counted_once(spark, world):
    expected = items(120)
    df = spark.createDataFrame([(i,) for i in expected], ["item"]).repartition(4)
    (df.write.format("wsrm-faulty").mode("append")
       .options(**world.options(fault="fail:1:0:25")).save())
    assert "fail" in open(world.marker).read()
    _deliver(world, expected)


def test_a_python_worker_killed_mid_partition_loses_and_duplicates_nothing(spark, world):
    expected = items(120)
    df = spark.createDataFrame([(i,) for i in expected], ["item"]).repartition(4)
    (df.write.format("wsrm-faulty").mode("append")
       .options(**world.options(fault="kill:2:0:35")).save())
    assert "kill" in open(world.marker).read()
    _deliver(world, expected)


def test_rdd_helper_commits_one_attempt_per_partition(spark, world):
    from wsrm_plugin.spark import TransactionalSink

    expected = items(60)
    rdd = spark.sparkContext.parallelize([{"item": i} for i in expected], 3)
    sink = TransactionalSink(**world.options())
    outcome = sink.run(rdd)
    assert (outcome.partitions, outcome.rows, outcome.messages) == (3, 60, 60)
    assert len(outcome.committed) == 6  # per partition: the rows' branch and the store's
    # this time the messages go out through the command-line sender
    send = subprocess.run([sys.executable, "-m", "wsrm_plugin.cli", "send", "--store", world.store,
                           "--until-acked", "--timeout", "120", "--retransmission-interval", "0.3",
                           "--report-every", "1"], capture_output=True, text=True, timeout=180)
    assert send.returncode == 0, send.stderr[-2000:]
    assert "unacked 0; open sequences 0; prepared branches 0" in send.stderr
    assert sorted(world.sent()) == sorted(expected)
    assert sorted(world.wait_recorded(len(expected))) == sorted(expected)


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow(minutes=2)
def test_driver_killed_after_prepares_then_recovered_and_rerun(spark, world):
    expected = items(90)
    options = world.options(fault="hang-commit", jobName="killed")
    driver = subprocess.Popen([sys.executable, "-m", "tests.spark.driver_proc", json.dumps(options),
                               str(len(expected))], cwd=ROOT, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: os.path.exists(world.marker) and "hang-commit" in
                         open(world.marker).read(), timeout=180), "the driver never reached commit"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    # every partition prepared its rows' and its messages' branches; nothing is visible yet
    assert len(world.prepared()) == 6 and world.sent() == []

    result = subprocess.run([sys.executable, "-m", "wsrm_plugin.cli", "spark-recover", "--log", world.log,
                             "--store", world.store, "--database", world.client_db, "--job", "killed",
                             "--node", "sparktest"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "0 committed, 6 rolled back" in result.stdout
    assert world.prepared() == [] and world.sent() == []

    # the rerun delivers every order exactly once (nothing of the dead run survives)
    df = spark.createDataFrame([(i,) for i in expected], ["item"]).repartition(3)
    df.write.format("wsrm").mode("append").options(**world.options(jobName="rerun")).save()
    _deliver(world, expected)



def test_an_attempt_that_prepared_but_lost_is_rolled_back_not_committed(spark, world):
    """What a speculative copy that lost the race leaves: prepared branches Spark did not accept.

    (Spark launches speculative copies only on another host than the
    original attempt, so real speculation cannot run on one test machine;
    this is the same situation for the sink: attempt 0 of partition 1
    prepares its rows and messages, then Spark takes attempt 1.)
    """
    expected = items(120)
    df = spark.createDataFrame([(i,) for i in expected], ["item"]).repartition(4)
    (df.write.format("wsrm-faulty").mode("append")
       .options(**world.options(fault="prepfail:1:0:0")).save())
    trace = open(world.marker).read()
    assert "prepfail" in trace and "write p1 a1" in trace, trace
    _deliver(world, expected)


def test_a_straggler_preparing_after_the_decision_is_rolled_back_by_recovery(world):
    """The slow copy of a partition prepares after the driver committed the fast one."""
    from wsrm_plugin.spark import SinkOptions, commit_job, recover_job, start_job, write_partition

    expected = items(30)
    options = start_job(SinkOptions.from_options(world.options(jobName="straggler")))
    rows = [{"item": i} for i in expected]
    fast = write_partition(options, rows, partition=0, attempt=1, task_attempt_id=7)
    outcome = commit_job(options, [fast])
    assert len(outcome.committed) == 2 and outcome.rolled_back == []
    slow = write_partition(options, rows, partition=0, attempt=0, task_attempt_id=3)
    assert len(world.prepared()) == 2 and sorted(world.sent()) == expected
    recovered = recover_job(log_path=world.log, store=world.store, database=world.client_db,
                            job=options.job, node="sparktest")
    assert sorted(map(str, recovered.rolled_back)) == sorted(str(x) for x in slow.prepared_xids())
    assert recovered.committed == []
    _deliver(world, expected)

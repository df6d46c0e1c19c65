"""The sink's options and job ids: bad input is refused with a message that says what to do."""

from __future__ import annotations

import pytest

from wsrm_plugin.spark.job import SinkOptions, branch_prefix, job_matches, new_job_xid

GOOD = {"target": "http://svc:8080/", "operation": "record", "store": "postgresql://rm@db/rms",
        "log": "/var/lib/app/tm.log"}


def test_spark_style_option_names_are_read():
    options = SinkOptions.from_options({**GOOD, "jobName": "orders", "batchSize": "25",
                                        "fields": "order, amount", "database": "dbname=shop",
                                        "table": "sent", "somethingElse": "x"})
    assert (options.job_name, options.batch_size, options.fields) == ("orders", 25, ("order", "amount"))
    assert options.wsdl_url == "http://svc:8080/?wsdl"
    assert options.extra == {"somethingElse": "x"}


@pytest.mark.parametrize("change, message", [
    ({"target": None}, "needs option"),
    ({"store": "sqlite:///rm.db"}, "must be a PostgreSQL store"),
    ({"database": "dbname=shop"}, "database and table go together"),
    ({"batchSize": "0"}, "at least 1"),
    ({"batchSize": "many"}, "must be a number"),
    ({"jobName": "no spaces"}, "jobName"),
])
def test_bad_options_are_refused_precisely(change, message):
    options = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        SinkOptions.from_options(options)


def test_job_ids_tell_runs_and_attempts_apart():
    first, second = new_job_xid("driver-1", "orders"), new_job_xid("driver-1", "orders")
    assert first != second and first.node == "driver-1"
    branch = first.branch(branch_prefix(3, 17) + "0")
    assert branch.bqual == b"p3.t17.0"
    assert job_matches(branch, "orders") and job_matches(branch, first.to_text())
    assert not job_matches(branch, second.to_text()) and not job_matches(branch, "order")
    assert not job_matches(new_job_xid("driver-1", "other").branch("x"), "orders")
    with pytest.raises(ValueError, match="shorten"):
        new_job_xid("n" * 32, "j" * 24)
    with pytest.raises(ValueError, match="not been started"):
        SinkOptions.from_options(GOOD).job_xid


def test_recovery_on_a_store_that_is_not_postgresql_is_refused_precisely(tmp_path):
    """``wsrm spark-recover --store`` reaches job_resources unchecked: it once failed with
    AttributeError ('SqliteStore' object has no attribute 'dsn')."""
    from wsrm_plugin.spark.coordinator import job_resources

    with pytest.raises(ValueError, match="message store is PostgreSQL"):
        job_resources(f"sqlite:///{tmp_path}/rm.db", None)


def test_the_rm_version_option_becomes_the_policys_version():
    from wsrm_plugin.spark.partition import _rm_version
    from wsrm_plugin.wire.namespaces import RM10, RM11

    assert (_rm_version("1.0"), _rm_version("1.1")) == (RM10, RM11)
    with pytest.raises(ValueError, match="rm_version must be one of"):
        _rm_version("1.2")

"""A Spark driver in its own process, for the test that SIGKILLs it: ``python -m
tests.spark.driver_proc <options json> <count> [master] [conf json]`` writes ``count`` orders with the faulty source."""

from __future__ import annotations

import json
import sys

from tests.spark.conftest import build_session, items


def main() -> None:
    options = json.loads(sys.argv[1])
    count = int(sys.argv[2])
    master = sys.argv[3] if len(sys.argv) > 3 else "local[2]"
    conf = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    spark = build_session(master, **conf)
    df = spark.createDataFrame([(i,) for i in items(count)], ["item"]).repartition(3)
    df.write.format("wsrm-faulty").mode("append").options(**options).save()
    spark.stop()


if __name__ == "__main__":
    main()

"""A reliable spyne server in its own process, for the crash and multi-process tests.

``python -m tests.spyne_server.server_process --store URL --port N --dsn DSN --node NAME --tm-log PATH``
serves the test service (its methods insert into ``orders`` through an
XADataSource, in the invoker's XA transaction), prints ``READY <url>`` and
runs until killed or until its stdin closes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from interceptors.spyne_server.service import reliable_service
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import invoker as invoker_module

from . import service
from .conftest import fast_policy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--tm-log", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--policy", default="{}", help="JSON: RMPolicy knobs over the fast policy")
    parser.add_argument("--broken", action="append", default=[], help="an item the method fails to process")
    parser.add_argument("--calls-file", help="where calls of broken items are counted")
    parser.add_argument("--quick-application", type=float,
                        help="QUICK_APPLICATION: held high, every request is delivered on its receipt")
    parser.add_argument("--counters", help="a JSON file the destination's counters go to at a clean stop")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.quick_application is not None:
        invoker_module.QUICK_APPLICATION = args.quick_application

    # safety_interval=0: the only other process that used this node name is dead
    tm = TransactionManager(node=args.node, log=args.tm_log, safety_interval=0)
    ds = XADataSource(args.dsn, tm)
    service.configure(ds=ds, node=args.node, delay=args.delay, broken=args.broken, calls_file=args.calls_file)
    server = reliable_service(service.application(), args.store, fast_policy(**json.loads(args.policy)), tm=tm)
    http = server.serve("127.0.0.1", args.port)
    server.start()
    print(f"READY {http.url}", flush=True)
    try:
        sys.stdin.read()  # the test closes stdin to stop us cleanly
    finally:
        server.stop(timeout=5)
        if args.counters:
            dest = server.engine.destination
            counters = {"receipts_at_commit": dest.receipts_at_commit,
                        "receipts_declined_at_commit": dest.receipts_declined_at_commit}
            with open(args.counters, "w", encoding="utf-8") as out:
                json.dump(counters, out)
        ds.close()
        tm.close()


if __name__ == "__main__":
    main()

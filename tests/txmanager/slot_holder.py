"""A process holding a node slot, for the slot tests: ``python -m tests.txmanager.slot_holder DIR [DSN DSN]``.

It claims a slot in DIR and prints ``SLOT <node>``.  With two DSNs it then
inserts a row into ``t`` of each database in one XA transaction and stops for
good once the commit decision is logged (both branches prepared), printing
``HELD``; the test kills it there.  Without DSNs it just waits to be killed.
"""

from __future__ import annotations

import sys
import time

from txmanager.postgres import XADataSource
from txmanager.slots import NodeSlots


def _hold(point: str, index: int) -> None:
    if point == "logged":
        print("HELD", flush=True)
        while True:
            time.sleep(3600)


def main() -> None:
    directory, dsns = sys.argv[1], sys.argv[2:]
    tm = NodeSlots(directory, "node").claim(checkpoint=_hold)
    print(f"SLOT {tm.node}", flush=True)
    if dsns:
        sources = [XADataSource(dsn, tm) for dsn in dsns]
        with tm.transaction():
            for ds in sources:
                with ds.connection() as conn, conn.cursor() as cur:
                    cur.execute("INSERT INTO t (v) VALUES (%s)", (tm.node,))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

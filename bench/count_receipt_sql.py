"""PostgreSQL instructions a message of the XA service's own transaction (callgrind, single-user).

Under XA in one database a service's message is, in PostgreSQL, BEGIN, the application's INSERT,
the receipt and take riding on the COMMIT (``statements._RECEIVE_IN_ORDER_CHECKED``, as the
store prepares and sends it), COMMIT; the outbox a team writes instead is BEGIN, an INSERT of
the message's id, the application's INSERT, COMMIT.  Rates and ``pg_stat_statements`` times
move with the machine's load; instructions do not.  This runs ``postgres --single`` (no
sockets, no other sessions) under ``valgrind --tool=callgrind`` on the store's real schema
(:data:`~wsrm_plugin.store.sql.schema.MIGRATIONS`), 16 sequences, at two message counts, and
prints the difference a message (start-up and schema left out).  Variants:

- ``riding``: the receipt as the store sends it;
- ``merged``: what the same receipt costs with the invoker's delivered ranges in
  ``rmd_sequence`` (one UPDATE of one row: a what-if, no store keeps them so; see
  :mod:`wsrm_plugin.store.sql.invoker` for why);
- ``outbox``: the two INSERTs of the outbox's service.

Run as root (the server runs as the ``postgres`` user) with valgrind installed::

    .venv/bin/python bench/count_receipt_sql.py [--variants riding,merged,outbox] [--calls 100,400]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from wsrm_plugin.store.sql import placeholders  # noqa: E402
from wsrm_plugin.store.sql.dialect import POSTGRES  # noqa: E402
from wsrm_plugin.store.sql.schema import MIGRATIONS  # noqa: E402
from wsrm_plugin.store.sql.statements import (  # noqa: E402
    _RECEIVE_IN_ORDER_CHECKED,
    RECEIPT_DECLINED,
    _prefix,
    _receipt_and_take_params,
)

BINDIR = Path("/usr/lib/postgresql/15/bin")
SEQUENCES = 16

#: the what-if: the receipt and the take as one UPDATE of a row that holds both ranges
_MERGED = (
    "WITH r AS (UPDATE rmd_sequence SET received = ?1, delivered = ?1, delivered_upto = ?5, "
    "last_activity = CASE WHEN last_activity + 1.0 < ?2 THEN ?2 ELSE last_activity END "
    "WHERE sequence_id = ?3 AND received = ?4 AND delivered = ?4 AND delivered_upto + 1 = ?5 "
    "AND NOT closed AND NOT terminated AND last_number IS NULL RETURNING 1) "
    f"SELECT CAST(CASE WHEN EXISTS (SELECT 1 FROM r) THEN '1' ELSE '{RECEIPT_DECLINED}' END AS integer)")


def _literal(value: object) -> str:
    """An ``EXECUTE`` argument as the store writes it (a number as quoted text: see
    :mod:`wsrm_plugin.store.prepared`)."""
    text = repr(value) if isinstance(value, float) else str(value)
    return "'" + text.replace("'", "''") + "'"


def script(variant: str, messages: int) -> str:
    """The single-user session's input (``-j``: a statement ends with a semicolon and a blank line)."""
    out = [stmt for _version, make in MIGRATIONS for stmt in make(POSTGRES)]
    out.append("CREATE TABLE received (id BIGSERIAL PRIMARY KEY, item TEXT, note TEXT)")
    if variant == "merged":
        out.append("ALTER TABLE rmd_sequence ADD COLUMN delivered TEXT NOT NULL DEFAULT '', "
                   "ADD COLUMN delivered_upto BIGINT NOT NULL DEFAULT 0")
    for i in range(SEQUENCES):
        seq = f"urn:uuid:{i:08d}-0000-4000-8000-000000000000"
        out.append("INSERT INTO rmd_sequence (sequence_id, acks_to, rm_version, wsa_version, received, "
                   "created_at, last_activity) VALUES "
                   f"('{seq}', 'http://www.w3.org/2005/08/addressing/anonymous', '1.1', '2005/08', '1', 0, 0)")
        out.append(f"INSERT INTO invoker_sequence VALUES ('{seq}', '1', 1)")
        if variant == "merged":
            out.append(f"UPDATE rmd_sequence SET delivered = '1', delivered_upto = 1 WHERE sequence_id = '{seq}'")
    receipt = {"riding": _RECEIVE_IN_ORDER_CHECKED, "merged": _MERGED}.get(variant)
    if receipt is not None:
        out.append(f"PREPARE receipt AS {placeholders.dollars(receipt)}")
    out.append("PREPARE app AS INSERT INTO received (item, note) VALUES ($1, $2)")
    if variant == "outbox":
        out.append("CREATE TABLE processed (message_id TEXT PRIMARY KEY)")
        out.append("PREPARE processed AS INSERT INTO processed VALUES ($1) ON CONFLICT DO NOTHING")
    now = 1764620000.0
    for m in range(messages):
        seq, number = f"urn:uuid:{m % SEQUENCES:08d}-0000-4000-8000-000000000000", 2 + m // SEQUENCES
        now += 0.0007
        out.append("BEGIN")
        if variant == "outbox":
            out.append(f"EXECUTE processed ('urn:uuid:{m:08d}-1111-4222-8333-444444444444')")
        out.append(f"EXECUTE app ('item-{m}', 'note')")
        if receipt is not None:
            params = _receipt_and_take_params(seq, number, now, _prefix(number - 1))
            out.append(f"EXECUTE receipt ({', '.join(_literal(p) for p in params)})")
        out.append("COMMIT")
    return "".join(statement + ";\n\n" for statement in out)


def instructions(variant: str, messages: int, template: Path, work: Path) -> int:
    """Callgrind's instruction total of one single-user run; raises where a receipt declined."""
    data = work / f"data_{variant}_{messages}"
    shutil.copytree(template, data, symlinks=True)
    shutil.chown(data, "postgres")
    for path in data.rglob("*"):
        shutil.chown(path, "postgres")
    out_file = work / f"cg_{variant}_{messages}.out"
    run = subprocess.run(
        ["su", "postgres", "-c",
         f"valgrind --tool=callgrind --callgrind-out-file={out_file} {BINDIR / 'postgres'} --single -j "
         f"-D {data} -c fsync=off -c synchronous_commit=off -c max_prepared_transactions=4 postgres"],
        input=script(variant, messages), capture_output=True, text=True, check=False)
    shutil.rmtree(data)
    if "ERROR" in run.stdout or "ERROR" in run.stderr:
        raise RuntimeError(f"{variant}: a statement failed:\n" + "\n".join(
            line for line in (run.stdout + run.stderr).splitlines() if "ERROR" in line)[:2000])
    found = re.search(r"^summary: (\d+)", out_file.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"{variant}: no callgrind summary in {out_file}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="riding,merged,outbox")
    parser.add_argument("--calls", default="100,400", help="the two message counts")
    args = parser.parse_args(argv)
    low, high = (int(n) for n in args.calls.split(","))
    if os.geteuid() != 0 or shutil.which("valgrind") is None:
        print("needs root (to run the server as postgres) and valgrind", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="count_receipt_sql_"))
    try:
        shutil.chown(work, "postgres")
        template = work / "template"
        subprocess.run(["su", "postgres", "-c", f"{BINDIR / 'initdb'} -A trust -U postgres -D {template}"],
                       check=True, capture_output=True)
        for variant in args.variants.split(","):
            a, b = instructions(variant, low, template, work), instructions(variant, high, template, work)
            print(f"{variant:8s} {(b - a) / (high - low) / 1000:8.1f} k instructions a message "
                  f"({low}: {a}, {high}: {b})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

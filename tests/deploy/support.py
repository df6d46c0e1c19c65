"""Running the deployment's processes from a test: gunicorn and waitress, their marks, the orders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import psycopg2

from tests.spyne_server import service
from wsrm_plugin.engine.transport import free_port  # noqa: F401 -- the deployment tests take it from here

ROOT = Path(__file__).resolve().parents[2]


def create_orders(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(service.SCHEMA)
    finally:
        conn.close()


def rows(dsn: str) -> list[tuple[str, str]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item, node FROM orders ORDER BY id")
            return cur.fetchall()
    finally:
        conn.close()


def prepared(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
            return [gid for (gid,) in cur.fetchall()]
    finally:
        conn.close()


def marks(directory: Path, kind: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob(f"{kind}-*"))]


class Deployment:
    """One server (gunicorn's arbiter or a waitress process), stopped with SIGTERM."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log: IO[bytes] = open(log, "ab")
        self.process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                                        stdout=self._log, stderr=subprocess.STDOUT)

    @classmethod
    def gunicorn(cls, port: int, workers: int, env: dict[str, str], log: Path) -> Deployment:
        return cls([sys.executable, "-m", "gunicorn", "-c", str(ROOT / "tests/deploy/gunicorn_conf.py"),
                    "-w", str(workers), "-b", f"127.0.0.1:{port}", "tests.deploy.app:app"], env, log)

    @classmethod
    def waitress(cls, port: int, env: dict[str, str], log: Path) -> Deployment:
        return cls([sys.executable, "-m", "tests.deploy.app", "--port", str(port)], env, log)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child of gunicorn may linger as a zombie until the arbiter reaps it
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False

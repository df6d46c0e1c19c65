"""A Spark standalone cluster on this one machine whose workers are DIFFERENT hosts.

Why: Spark never launches a speculative copy of a task on a host that
already runs an attempt of it (``TaskSetManager`` skips hosts with
``hasAttemptOnHost``), and local mode is one host, so real speculation
needs two.  Linux routes all of 127.0.0.0/8 on ``lo``: a worker bound to
127.0.0.2 and one bound to 127.0.0.3 (``SPARK_LOCAL_IP`` /
``SPARK_LOCAL_HOSTNAME`` in each one's environment, inherited by its
executors and their Python workers) are two executor hosts for the
scheduler.

::

    with StandaloneCluster(log_dir=tmp_path / "cluster") as cluster:
        spark = SparkSession.builder.master(cluster.master_url)...

Every process the cluster starts (master, workers, executors, Python
daemons and workers) carries one random token in its environment; that is
how :meth:`StandaloneCluster.processes` finds them all, even those whose
parent died, and how :meth:`StandaloneCluster.stop` leaves no JVM behind.
Linux only (``/proc``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["StandaloneCluster", "ClusterError", "spark_home"]

log = logging.getLogger(__name__)

#: The environment variable whose value marks every process of one cluster.
TOKEN_ENV = "WSRM_TEST_SPARK_CLUSTER"
_MASTER = "org.apache.spark.deploy.master.Master"
_WORKER = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The cluster could not start, or could not be stopped completely."""


def spark_home() -> Path:
    """The Spark distribution inside the installed ``pyspark`` package (it has ``bin/spark-class``)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise ClusterError(f"no bin/spark-class under {home}: install pyspark from PyPI "
                           "(pip install pyspark), which ships the Spark jars and scripts")
    return home


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return
    if shutil.which("java") is None:
        raise ClusterError("Java is needed to run a Spark cluster and none was found: install a "
                           "JRE 17 or 21 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) "
                           "or set JAVA_HOME")


def _free_port(host: str) -> int:
    """Below the ephemeral range: see :func:`wsrm_plugin.engine.transport.free_port`."""
    from wsrm_plugin.engine.transport import free_port

    return free_port(host)


def _environ_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:  # gone, or a zombie
        return b""


def _cmdline_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class StandaloneCluster:
    """A master on ``master_host`` and one single-core worker per address of ``workers``.

    ``env`` is added to every process's environment (``PYTHONPATH`` for the
    executors' Python workers, typically).  Logs, the workers' work
    directories and their local dirs go to ``log_dir`` (a fresh temporary
    directory when omitted).
    """

    def __init__(self, workers: Sequence[str] = ("127.0.0.2", "127.0.0.3"), *,
                 master_host: str = "127.0.0.1", cores: int = 1, memory: str = "1g",
                 daemon_memory: str = "256m", env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike[str] | None = None, start_timeout: float = 180.0) -> None:
        if len(set(workers)) != len(workers):
            raise ValueError(f"worker addresses must differ (each one is a host): {list(workers)}")
        self.workers = tuple(workers)
        self.master_host = master_host
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.extra_env = dict(env or {})
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="spark-cluster-"))
        self.start_timeout = start_timeout
        self.token = uuid.uuid4().hex
        self.master_port = 0
        self.webui_port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- addresses -------------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host}:{self.master_port}"

    @property
    def web_url(self) -> str:
        return f"http://{self.master_host}:{self.webui_port}"

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> "StandaloneCluster":
        self.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def start(self) -> None:
        """Start the master and the workers; return once every worker is registered and alive."""
        _check_java()
        home = spark_home()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.master_port = _free_port(self.master_host)
        self.webui_port = _free_port(self.master_host)
        try:
            self._spawn("master", self.master_host, home,
                        [_MASTER, "--host", self.master_host, "--port", str(self.master_port),
                         "--webui-port", str(self.webui_port)])
            for n, host in enumerate(self.workers):
                work = self.log_dir / f"worker-{n}"
                (work / "local").mkdir(parents=True, exist_ok=True)
                self._spawn(f"worker-{n}", host, home,
                            [_WORKER, "--host", host, "--cores", str(self.cores),
                             "--memory", self.memory, "--webui-port", "0",
                             "--work-dir", str(work / "apps"), self.master_url],
                            SPARK_LOCAL_DIRS=str(work / "local"))
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        log.info("spark standalone cluster up at %s with workers %s (logs in %s)", self.master_url,
                 ", ".join(self.workers), self.log_dir)

    def _spawn(self, name: str, host: str, home: Path, args: list[str], **env: str) -> None:
        environ = {**os.environ, **self.extra_env, **env, TOKEN_ENV: self.token,
                   "SPARK_HOME": str(home), "SPARK_LOCAL_IP": host, "SPARK_LOCAL_HOSTNAME": host,
                   "SPARK_DAEMON_MEMORY": self.daemon_memory,
                   # the master's REST submission server would take the fixed port 6066
                   "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                   "SPARK_LOG_DIR": str(self.log_dir), "SPARK_PID_DIR": str(self.log_dir)}
        out = open(self.log_dir / f"{name}.log", "wb")
        try:
            self._procs[name] = subprocess.Popen([str(home / "bin" / "spark-class"), *args],
                                                 env=environ, stdout=out, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()

    def status(self) -> dict[str, Any]:
        """The master's own view (its web UI's ``/json/``): workers, applications, cores."""
        with urllib.request.urlopen(self.web_url + "/json/", timeout=10) as response:
            return json.load(response)

    def _wait_registered(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"spark {name} exited with {proc.returncode} while starting; "
                                       f"its log ends with:\n{self.log_tail(name)}")
            try:
                seen = self.status()
            except (OSError, ValueError):  # the master's web UI is not up yet
                time.sleep(0.5)
                continue
            alive = {w.get("host") for w in seen.get("workers", []) if w.get("state") == "ALIVE"}
            if alive >= set(self.workers):
                return
            time.sleep(0.5)
        raise ClusterError(f"workers {list(self.workers)} did not all register with {self.master_url} "
                           f"within {self.start_timeout:.0f}s (master sees {seen.get('workers')}); "
                           f"see the logs in {self.log_dir}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log: {exc})"

    # -- processes -------------------------------------------------------------------------------

    def processes(self) -> list[int]:
        """Pids of every live process of this cluster (daemons, executors, Python workers)."""
        marker = f"{TOKEN_ENV}={self.token}".encode()
        me = os.getpid()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me and marker in _environ_of(int(entry)).split(b"\0"):
                found.append(int(entry))
        return sorted(found)

    def executor_processes(self) -> list[int]:
        """The processes working for applications: everything but the master and the workers."""
        daemons = {p.pid for p in self._procs.values()}
        return [pid for pid in self.processes() if pid not in daemons]

    def wait_executors_gone(self, timeout: float = 120.0) -> bool:
        """Wait until no application runs and no executor or Python worker is left (after the
        driver stopped, the workers kill their executors)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.executor_processes():
                return True
            time.sleep(0.3)
        return False

    def describe(self, pids: Sequence[int]) -> str:
        return "; ".join(f"{pid}: {_cmdline_of(pid)[:160]}" for pid in pids)

    def stop(self, timeout: float = 60.0) -> None:
        """Kill every process of the cluster and reap the ones started here.

        SIGTERM first (the workers then stop their executors), SIGKILL for
        whatever is still there after a few seconds.  Raises
        :class:`ClusterError` naming the survivors if any process is left.
        """
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        grace = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            for proc in self._procs.values():
                proc.poll()
            left = self.processes()
            if not left:
                break
            if time.monotonic() > grace:
                self._signal_all(signal.SIGKILL)
            time.sleep(0.2)
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        left = self.processes()
        if left:
            raise ClusterError(f"processes of the spark cluster survived SIGKILL: {self.describe(left)}")

    def _signal_all(self, sig: signal.Signals) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

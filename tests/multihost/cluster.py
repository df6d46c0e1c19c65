"""Hosts for the multi-host tests: Linux network namespaces of the test's own, PostgreSQL, haproxy.

A :class:`Cluster` builds, as root, a bridge with address ``10.211.K.1/24``
in the test's namespace and one network namespace per host, each joined to
the bridge by a veth pair (``10.211.K.1x``).  PostgreSQL listens on the
bridge; haproxy (Debian's, installed by ``scripts/bootstrap.sh``) balances
``http://10.211.K.1:<port>/`` round robin over the hosts, checking each
one's ``/healthz/ready``.  A host is ``python -m tests.multihost.host_app`` run
with ``ip netns exec`` (so its pid is the Python process: SIGKILL kills the
host).  Dropping a host's link (:meth:`Cluster.cut`) leaves its TCP
connections hanging, as a real network partition does.

Every address belongs to namespaces this test made; traffic never leaves
the machine.  Where namespaces cannot be made (not root), the hosts are
plain processes on loopback addresses ``127.211.K.1x`` instead: everything
but a partition can be shown so, and the partition test skips, saying why.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

import psycopg2

from tests.spyne_server import service
from txmanager.xid import Xid
from wsrm_plugin.tools.pgserver import ThrowawayPostgres

ROOT = Path(__file__).resolve().parents[2]
HOST_PORT = 8080


def namespaces_allowed() -> str | None:
    """None when this process can make network namespaces, else why not.

    ``WSRM_TEST_NO_NETNS=1`` says no, to run the fallback (processes on
    loopback addresses) where namespaces would work."""
    if os.environ.get("WSRM_TEST_NO_NETNS"):
        return "WSRM_TEST_NO_NETNS is set"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    probe = f"w31p{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def _free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    for _ in range(200):
        k = random.randint(1, 254)
        if f" 10.211.{k}." not in used:
            return k
    raise RuntimeError("no free 10.211.K.0/24 subnet for the test's hosts")


class Host:
    """One host process in its namespace."""

    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.ns = f"w31-{cluster.k}-{index}"
        self.veth = f"w31v{cluster.k}h{index}"
        self.address = f"{cluster.prefix}.{10 + index}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = cluster.workdir / f"host{index}.log"
        self._log: IO[bytes] | None = None
        self.node: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{HOST_PORT}/"

    def start(self, extra_env: dict[str, str] | None = None) -> Host:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.cluster.env, **(extra_env or {}),
               "LISTEN": f"{self.address}:{HOST_PORT}"}
        env.pop("PGAPPNAME", None)
        self._log = open(self.log_path, "ab")
        command = [sys.executable, "-m", "tests.multihost.host_app"]
        if self.cluster.netns:
            command = ["ip", "netns", "exec", self.ns, *command]
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        pid = self.process.pid
        if not wait_for(lambda: (self.cluster.marks / f"started-{pid}").exists() or not self.alive, 120):
            raise AssertionError(f"host {self.index} did not start:\n{self.output()}")
        if not self.alive:
            raise AssertionError(f"host {self.index} exited at start:\n{self.output()}")
        self.node = json.loads((self.cluster.marks / f"started-{pid}").read_text())["node"]
        if not wait_for(lambda: self.status("healthz/ready") == 200, 60):
            raise AssertionError(f"host {self.index} is not healthy:\n{self.output()}")
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> float:
        """SIGKILL the host's process; returns the instant (monotonic) it was sent."""
        assert self.process is not None
        at = time.monotonic()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        return at

    def stop(self) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def get(self, path: str, timeout: float = 10.0) -> str | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.read().decode()
        except OSError:
            return None

    def status(self, path: str, timeout: float = 10.0) -> int | None:
        """The HTTP status of ``GET path`` (None: no answer)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path.exists() else ""


class Cluster:
    """PostgreSQL, ``size`` host namespaces and haproxy in front (see the module docstring)."""

    def __init__(self, workdir: Path, size: int = 3, *, takeover_within: float = 10.0,
                 balance: str = "roundrobin") -> None:
        self.workdir = workdir
        #: haproxy's ``balance`` (``hdr(WSRM-Sequence)``: a sequence stays on one host while it lives)
        self.balance = balance
        #: hosts in network namespaces of their own (else processes on loopback addresses)
        self.netns = namespaces_allowed() is None
        self.k = _free_subnet() if self.netns else random.randint(1, 254)
        self.prefix = f"10.211.{self.k}" if self.netns else f"127.211.{self.k}"
        self.gateway = f"{self.prefix}.1"
        self.bridge = f"w31b{self.k}"
        self.marks = workdir / "marks"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.takeover_within = takeover_within
        self.hosts = [Host(self, i) for i in range(size)]
        self.pg: ThrowawayPostgres | None = None
        self._made: list[tuple[str, str]] = []
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.lb_port = 0
        self.env: dict[str, str] = {}
        self.store_dsn = self.orders_dsn = ""

    @property
    def public_url(self) -> str:
        return f"http://{self.gateway}:{self.lb_port}/"

    def start(self) -> Cluster:
        try:
            if self.netns:
                self._network_retrying()
            extra = [self.gateway] if self.netns else []
            self.pg = ThrowawayPostgres(also_listen=extra, trust_networks=[f"{self.prefix}.0/24"] if extra else [],
                                        max_connections=300, max_prepared_transactions=100)
            self.pg.start()
            self.store_dsn = self._dsn(self.pg.create_database("store"))
            self.orders_dsn = self._dsn(self.pg.create_database("orders"))
            conn = psycopg2.connect(self.orders_dsn)
            with conn, conn.cursor() as cur:
                cur.execute(service.SCHEMA)
            conn.close()
            self.lb_port = _free_port(self.gateway)
            self.env = {"STORE_DSN": self.store_dsn, "ORDERS_DSN": self.orders_dsn, "PUBLIC_URL": self.public_url,
                        "MARK_DIR": str(self.marks), "TAKEOVER_WITHIN": str(self.takeover_within)}
            self._haproxy()
        except BaseException:
            self.close()
            raise
        return self

    def _dsn(self, dsn: str) -> str:
        """The DSN on the bridge address: the hosts reach the server there, the test too."""
        return dsn.replace("host=127.0.0.1", f"host={self.gateway}") if self.netns else dsn

    def _network_retrying(self) -> None:
        """Make the network, on another subnet when a test starting at the same time took this one."""
        for attempt in range(5):
            try:
                self._network()
                return
            except RuntimeError as exc:
                if "exists" not in str(exc) or attempt == 4:
                    raise
                self._remove_network()
                self.k = _free_subnet()
                self.prefix = f"10.211.{self.k}"
                self.gateway = f"{self.prefix}.1"
                self.bridge = f"w31b{self.k}"
                self.hosts = [Host(self, h.index) for h in self.hosts]

    def _remove_network(self) -> None:
        """Remove what this cluster made (never a namesake another test made at the same time)."""
        for kind, name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name] if kind == "netns" else ["ip", "link", "del", name],
                           capture_output=True)
        self._made.clear()

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            _ip("netns", "add", host.ns)
            self._made.append(("netns", host.ns))
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
            _ip("link", "set", host.veth, "master", self.bridge, "up")
            _ip("addr", "add", f"{host.address}/24", "dev", "eth0", ns=host.ns)
            _ip("link", "set", "eth0", "up", ns=host.ns)
            _ip("link", "set", "lo", "up", ns=host.ns)
            _ip("route", "add", "default", "via", self.gateway, ns=host.ns)

    def _haproxy(self) -> None:
        config = self.workdir / "haproxy.cfg"
        servers = "\n".join(f"    server h{h.index} {h.address}:{HOST_PORT} check" for h in self.hosts)
        balance = self.balance if self.balance == "roundrobin" else f"{self.balance}\n    hash-type consistent"
        config.write_text(HAPROXY_CONFIG.format(bind=f"{self.gateway}:{self.lb_port}", servers=servers,
                                                balance=balance, socket=self.workdir / "haproxy.sock"))
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not os.path.exists(binary):
            raise AssertionError("haproxy is needed by this test: run scripts/bootstrap.sh (it installs Debian's)")
        with open(self.workdir / "haproxy.log", "ab") as out:
            self.haproxy = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT)

    def start_hosts(self, count: int | None = None) -> None:
        for host in self.hosts[:count]:
            host.start()
        assert wait_for(self.lb_ready, 60), "haproxy sees no healthy host"
        started = {f"h{h.index}" for h in self.hosts if h.alive}
        assert wait_for(lambda: started <= self.lb_up(), 60), f"haproxy sees {self.lb_up()} up, not {started}"

    def lb_up(self) -> set[str]:
        """The servers haproxy has up now (its stats socket's ``show servers state``)."""
        import socket

        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5)
                sock.connect(str(self.workdir / "haproxy.sock"))
                sock.sendall(b"show servers state hosts\n")
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
        except OSError:
            return set()
        up = set()
        for line in answer.decode().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[0].isdigit() and fields[5] == "2":  # srv_op_state 2: running
                up.add(fields[3])
        return up

    def lb_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.public_url + "healthz/ready", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def routed(self) -> list[tuple[str, str]]:
        """(server, WSRM-Sequence header) of every request haproxy logged so far."""
        text = (self.workdir / "haproxy.log").read_text(errors="replace")
        found = re.findall(r" hosts/h(\d+) .*?\{([^}]*)\}", text)
        return [(f"h{server}", sequence) for server, sequence in found]

    def cut(self, host: Host) -> None:
        """Drop the host's link: its packets go nowhere, its connections hang (a partition)."""
        if not self.netns:
            raise RuntimeError("a partition needs the hosts in network namespaces")
        _ip("link", "set", host.veth, "down")

    def mend(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    # -- what the database says ------------------------------------------------------------------

    def query(self, dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = psycopg2.connect(dsn, connect_timeout=10)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    def orders(self) -> list[tuple[str, str]]:
        return [(item, node) for item, node in self.query(self.orders_dsn, "SELECT item, node FROM orders ORDER BY id")]

    def prepared(self, node: str | None = None) -> list[str]:
        """The gids prepared in the cluster (of ``node`` only, when given)."""
        gids = [gid for (gid,) in self.query(self.store_dsn, "SELECT gid FROM pg_prepared_xacts")]
        if node is None:
            return gids
        return [gid for gid in gids if _node_of(gid) == node]

    def node_locked(self, node: str) -> bool:
        """True while a session holds ``node``'s claim (its advisory lock)."""
        return bool(self.query(self.store_dsn,
                               "SELECT 1 FROM pg_locks l JOIN txm_node n ON l.objid = n.id "
                               "WHERE l.locktype = 'advisory' AND l.classid = %s AND n.name = %s AND l.granted",
                               (0x57533331, node)))

    def released(self, node: str) -> bool:
        """The dead node holds nothing any more: no claim, no prepared branch (and so no row lock)."""
        return not self.node_locked(node) and not self.prepared(node)

    def close(self) -> None:
        for host in self.hosts:
            try:
                host.stop()
            except Exception:  # noqa: BLE001 -- tear everything down regardless
                pass
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.kill()
            self.haproxy.wait(10)
        if self.pg is not None:
            self.pg.close()
        if self.netns:
            self._remove_network()

    def outputs(self) -> str:
        return "\n".join(f"--- host {h.index} ({h.node}, pid {h.process.pid if h.process else '-'})\n{h.output()}"
                         for h in self.hosts)


def _node_of(gid: str) -> str | None:
    xid = Xid.from_pg_gid(gid)
    return xid.node if xid is not None else None


def _free_port(host: str) -> int:
    """Below the ephemeral range: see :func:`wsrm_plugin.engine.transport.free_port`."""
    from wsrm_plugin.engine.transport import free_port

    return free_port(host)


#: The load balancer of the tests, and the example of the deployment guide (docs/deploy.md):
#: round robin, no affinity, a request a dead host did not answer retried on another.
HAPROXY_CONFIG = """\
global
    maxconn 4000
    log stdout format raw local0
    stats socket {socket}

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 2
    option redispatch

frontend wsrm
    bind {bind}
    capture request header WSRM-Sequence len 100
    default_backend hosts

backend hosts
    balance {balance}
    option httpchk GET /healthz/ready
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2
{servers}
"""

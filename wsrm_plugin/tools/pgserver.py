"""A throwaway PostgreSQL server for tests and demos.

Two-phase commit can only be shown honestly against a real server that can
be killed at any instant and started again on the same data: the prepared
transactions must survive, keep their row locks, and be found by recovery.
:class:`ThrowawayPostgres` gives exactly that, without touching the machine's
own cluster: its own data directory, a free port on 127.0.0.1, its socket
inside the data directory, trust authentication for one superuser role.

Why not ``pg_ctl`` or pytest-postgresql: ``postgres`` runs here as a *direct*
child process, so :meth:`kill` can SIGKILL it and ``wait()`` for it.  A
postmaster killed through ``pg_ctl`` lingers as a zombie for a moment and
blocks a restart on the same data directory.  And ``initdb``/``postgres``
refuse to run as root: when this process is root, both run as an
unprivileged OS user (``postgres`` by default) and the data directory is
handed over to it.

Linux only: :meth:`kill` finds the server's processes through ``/proc``
(by working directory: each of them sits in the data directory).
"""

from __future__ import annotations

import atexit
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Mapping, Sequence

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import make_dsn

__all__ = [
    "ThrowawayPostgres",
    "PostgresServerError",
    "PostgresNotInstalledError",
    "find_bindir",
    "server_processes",
    "is_process_alive",
]

log = logging.getLogger(__name__)

#: Environment variable naming the directory that holds ``initdb`` and ``postgres``.
BINDIR_ENV = "WSRM_PG_BINDIR"

_INSTALL_HINT = (
    "install the PostgreSQL server (scripts/bootstrap.sh does it; on Debian/Ubuntu: "
    f"apt-get install postgresql) or set {BINDIR_ENV} to the directory holding initdb and postgres"
)
_DBNAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_PORT_IN_USE = ("could not bind", "Address already in use", "could not create any TCP/IP sockets")
#: What a start says while a process of the SIGKILLed server still holds its shared memory.
_SHARED_MEMORY_IN_USE = "pre-existing shared memory block"


class PostgresServerError(RuntimeError):
    """The throwaway server could not be set up, started or stopped."""


class PostgresNotInstalledError(PostgresServerError):
    """No PostgreSQL server binaries were found on this machine."""


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / exe, os.X_OK) for exe in ("initdb", "postgres"))


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (0,)


def find_bindir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding ``initdb`` and ``postgres``.

    Looked up in this order: ``explicit``, ``$WSRM_PG_BINDIR``, the newest
    ``/usr/lib/postgresql/<version>/bin`` (Debian's layout, not on PATH),
    ``pg_config --bindir``, then PATH.
    """
    for given in (explicit, os.environ.get(BINDIR_ENV)):
        if given:
            path = Path(given)
            if not _has_server(path):
                raise PostgresNotInstalledError(f"{path} holds no initdb and postgres: {_INSTALL_HINT}")
            return path
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    for path in debian:
        if _has_server(path):
            return path
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10)
            path = Path(out.stdout.strip())
            if out.returncode == 0 and _has_server(path):
                return path
        except (OSError, subprocess.SubprocessError):
            pass
    postgres = shutil.which("postgres")
    if postgres and _has_server(Path(postgres).parent):
        return Path(postgres).parent
    raise PostgresNotInstalledError(f"no PostgreSQL server binaries found: {_INSTALL_HINT}")


def _free_port(host: str) -> int:
    from wsrm_plugin.engine.transport import free_port  # below the ephemeral range: see there

    return free_port(host)


def _process_state(pid: int) -> str | None:
    """The one-letter /proc state of ``pid`` (R, S, T, Z...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the state follows the last ')'.
    return stat[stat.rfind(b")") + 2:].split()[0].decode()


def is_process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return _process_state(pid) not in (None, "Z", "X")


def server_processes(data_dir: str | os.PathLike[str], executable: str | os.PathLike[str]) -> list[int]:
    """Every live process of the server that runs ``executable`` on ``data_dir``.

    Found by working directory: the postmaster and every process it forks sit
    in the data directory.  Unlike a process tree, this still finds the
    backends of a postmaster that was SIGKILLed (they are orphans then, and
    PostgreSQL makes each one its own process-group leader).  The executable
    must match too, so a shell that happens to sit in the directory is spared.
    """
    target = os.path.realpath(data_dir)
    exe = os.path.realpath(executable)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") != target or os.readlink(f"/proc/{entry}/exe") != exe:
                continue
        except OSError:
            continue
        if is_process_alive(int(entry)):
            found.append(int(entry))
    return found


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2:].split()[19])


def _kill_orphans(
    data_dir: Path, exe: Path, known: dict[int, int | None] | None = None, timeout: float = 15.0
) -> None:
    """SIGKILL what is left of a dead postmaster and wait until it is gone.

    A restart refuses to start while one of the old backends still holds the
    shared memory.  A process drops its working directory midway through
    exiting, so the ones seen once (``known``: pid -> start time, listed
    before the postmaster was killed) are followed by pid and start time (in
    case the pid is reused) until they are gone or zombies.
    """
    deadline = time.monotonic() + timeout
    seen: dict[int, int | None] = dict(known or {})
    while True:
        for pid in server_processes(data_dir, exe):
            seen.setdefault(pid, _start_time(pid))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = [pid for pid, started in seen.items() if is_process_alive(pid) and _start_time(pid) == started]
        if not left and not server_processes(data_dir, exe):
            return
        if time.monotonic() > deadline:
            raise PostgresServerError(f"processes {left} of the server on {data_dir} survive SIGKILL")
        time.sleep(0.005)


# Every server process started here, so an interpreter that exits without
# close() (a crashed test run) does not leave servers behind.
_live: dict["subprocess.Popen[bytes]", tuple[Path, Path]] = {}
_live_lock = threading.Lock()


@atexit.register
def _kill_leftovers() -> None:
    with _live_lock:
        procs = list(_live.items())
    for proc, (data_dir, exe) in procs:
        _hard_kill(proc, data_dir, exe)


def _hard_kill(proc: "subprocess.Popen[bytes]", data_dir: Path, exe: Path) -> None:
    """SIGKILL the postmaster first (so it forks no more), reap it, then its children."""
    known = {pid: _start_time(pid) for pid in server_processes(data_dir, exe)}
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    with _live_lock:
        _live.pop(proc, None)
    _kill_orphans(data_dir, exe, known)


class ThrowawayPostgres:
    """A private PostgreSQL server on 127.0.0.1 that a test may crash and restart.

    ``with ThrowawayPostgres() as pg: pg.create_database("app")`` gives a
    running server; leaving the block stops it and deletes its files (unless
    ``keep=True`` or ``data_dir`` was given: a caller's directory is never
    deleted).  With ``data_dir`` pointing at an initialized directory the
    server starts on that data, which lets a demo survive its own restart.

    Settings that matter for 2PC are explicit: ``fsync`` on (a prepared
    transaction must be on disk), ``max_prepared_transactions`` (PostgreSQL's
    default is 0, which disables PREPARE TRANSACTION), ``max_connections``.
    ``settings`` adds or overrides any other server setting.

    Run by root, ``initdb`` and ``postgres`` run as ``os_user`` (they refuse
    root), and the data directory is given to that user; otherwise they run as
    the calling user.  ``user`` is the database superuser role (trust
    authentication, loopback only).  The port is free when first chosen and
    kept across restarts.  ``also_listen`` adds addresses to listen on and
    ``trust_networks`` the networks trusted besides loopback (the addresses of
    a test's own network namespaces, never a real network).
    """

    host = "127.0.0.1"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        user: str = "postgres",
        bindir: str | os.PathLike[str] | None = None,
        max_prepared_transactions: int = 64,
        max_connections: int = 100,
        settings: Mapping[str, Any] | None = None,
        keep: bool = False,
        os_user: str = "postgres",
        startup_timeout: float = 60.0,
        also_listen: Sequence[str] = (),
        trust_networks: Sequence[str] = (),
    ) -> None:
        if max_prepared_transactions < 1:
            raise ValueError("max_prepared_transactions must be >= 1: 0 disables PREPARE TRANSACTION")
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", user):
            raise ValueError(f"superuser role name {user!r} must be a plain identifier")
        self.user = user
        self.keep = keep
        #: more addresses the server listens on (a test's own network namespaces reach it there),
        #: and the networks (CIDR) whose clients it trusts besides loopback
        self.also_listen = tuple(also_listen)
        self.trust_networks = tuple(trust_networks)
        self.startup_timeout = startup_timeout
        self._bindir_arg = bindir
        self._bindir: Path | None = None
        self._port_fixed = port is not None
        self.port: int = port if port is not None else _free_port(self.host)
        self._own_base: Path | None = None
        if data_dir is None:
            self._own_base = Path(tempfile.mkdtemp(prefix="wsrm-pg-"))
            self.data_dir = self._own_base / "data"
        else:
            self.data_dir = Path(data_dir).absolute()
        self.log_path = self.data_dir / "server.log"
        self._settings: dict[str, Any] = {
            "fsync": "on",
            "synchronous_commit": "on",
            "max_prepared_transactions": max_prepared_transactions,
            "max_connections": max_connections,
            "shared_buffers": "32MB",
            "logging_collector": "off",
            "log_line_prefix": "%m [%p] ",
            **(settings or {}),
        }
        self._run_as: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._run_as = pwd.getpwnam(os_user)
            except KeyError:
                raise PostgresServerError(
                    f"running as root, but OS user {os_user!r} does not exist: initdb and postgres "
                    f"refuse to run as root; create it (useradd --system {os_user}) or pass os_user="
                ) from None
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False

    # -- discovery -------------------------------------------------------------

    @staticmethod
    def available(bindir: str | os.PathLike[str] | None = None) -> bool:
        """True when the server binaries are installed (see :func:`find_bindir`)."""
        try:
            find_bindir(bindir)
        except PostgresNotInstalledError:
            return False
        return True

    @property
    def bindir(self) -> Path:
        if self._bindir is None:
            self._bindir = find_bindir(self._bindir_arg)
        return self._bindir

    @property
    def _postgres(self) -> Path:
        return self.bindir / "postgres"

    # -- lifecycle -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return self._proc.pid if self.running else None  # type: ignore[union-attr]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def pids(self) -> list[int]:
        """Every live process of this server: postmaster, backends, checkpointer, ...

        Also lists the orphans of a postmaster killed from outside.
        """
        return server_processes(self.data_dir, self._postgres) if self.data_dir.exists() else []

    def start(self) -> "ThrowawayPostgres":
        """Initialize the data directory if it is new, start the server, wait until it accepts connections.

        After :meth:`kill` this runs crash recovery on the same data: prepared
        transactions come back, with their locks.
        """
        if self._closed:
            raise PostgresServerError("this server was closed; create a new ThrowawayPostgres")
        if self.running:
            return self
        if self._proc is not None:  # the postmaster died under us: reap it and its orphans
            _hard_kill(self._proc, self.data_dir, self._postgres)
            self._proc = None
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        attempts = 1 if self._port_fixed else 5
        for attempt in range(attempts):
            try:
                self._spawn_when_memory_is_free()
                self._port_fixed = True  # a restart must keep the port: callers hold DSNs with it
                return self
            except PostgresServerError as exc:
                port_taken = any(s in str(exc) for s in _PORT_IN_USE)
                if not port_taken or attempt == attempts - 1:
                    raise
                log.info("port %d was taken meanwhile, trying another one", self.port)
                self.port = _free_port(self.host)
        raise AssertionError("unreachable")

    def _spawn_when_memory_is_free(self, timeout: float = 15.0) -> None:
        """Start the server; while PostgreSQL says a process of the killed one still holds the
        shared memory, kill what is left, wait a moment and start again.

        A backend SIGKILLed with its postmaster may still be tearing down its memory when no
        process of the server is left to see (a CI run restarted into exactly that).
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._spawn_and_wait()
                return
            except PostgresServerError as exc:
                if _SHARED_MEMORY_IN_USE not in str(exc) or time.monotonic() > deadline:
                    raise
                log.info("the killed server's shared memory is still in use; starting again shortly")
            _kill_orphans(self.data_dir, self._postgres)
            time.sleep(0.2)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: roll back active sessions, checkpoint, exit); SIGKILL when it hangs.

        Prepared transactions survive a stop as they survive a crash.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("PostgreSQL (pid %d) ignored a fast shutdown for %.0fs; killing it", proc.pid, timeout)
        _hard_kill(proc, self.data_dir, self._postgres)
        self._proc = None

    def kill(self) -> None:
        """Crash the server: SIGKILL to the postmaster and all its children, then reap them.

        Nothing is flushed or cleaned up, as after a power cut of the server
        (the OS keeps what was written, so fsynced data and prepared
        transactions survive).  :meth:`start` may be called right after.
        """
        proc = self._proc
        if proc is None:
            return
        _hard_kill(proc, self.data_dir, self._postgres)
        self._proc = None

    def wait_killed(self, timeout: float = 30.0) -> None:
        """Wait for a postmaster that someone else SIGKILLed (a test's crash
        point) to be gone, reap it, and kill its orphaned backends, so that
        :meth:`start` can run crash recovery on the same data right away."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise PostgresServerError(
                f"PostgreSQL (pid {proc.pid}) still runs {timeout:.0f}s after it should have been killed"
            ) from None
        _hard_kill(proc, self.data_dir, self._postgres)
        self._proc = None

    def restart(self) -> "ThrowawayPostgres":
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove the temporary directory (unless ``keep``)."""
        if self._closed:
            return
        try:
            self.stop()
        finally:
            self._closed = True
            if self._own_base is not None and not self.keep:
                shutil.rmtree(self._own_base, ignore_errors=True)

    def __enter__(self) -> "ThrowawayPostgres":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<ThrowawayPostgres {self.host}:{self.port} {self.data_dir} {state}>"

    # -- connections -----------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for ``dbname`` on this server, as its superuser."""
        return make_dsn(host=self.host, port=self.port, user=self.user, dbname=dbname)

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> "psycopg2.extensions.connection":
        return psycopg2.connect(self.dsn(dbname), **kwargs)

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its DSN."""
        self._check_dbname(name)
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting its sessions.  Its prepared transactions must be finished first."""
        self._check_dbname(name)
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log (what to read when a start fails)."""
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return ""

    # -- internals ---------------------------------------------------------------

    @staticmethod
    def _check_dbname(name: str) -> None:
        if not _DBNAME_RE.match(name):
            raise ValueError(f"database name {name!r}: use 1-63 chars of [A-Za-z0-9_], not starting with a digit")

    def _admin(self, statement: sql.Composable) -> None:
        conn = self.connect(connect_timeout=10)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def _popen_identity(self) -> dict[str, Any]:
        if self._run_as is None:
            return {}
        return {"user": self._run_as.pw_uid, "group": self._run_as.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env.pop("LANG", None)
        if self._run_as is not None:
            env["HOME"] = self._run_as.pw_dir
            env["USER"] = env["LOGNAME"] = self._run_as.pw_name
        return env

    def _give_to_server_user(self, path: Path) -> None:
        if self._run_as is not None:
            os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)

    def _initdb(self) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise PostgresServerError(
                f"{self.data_dir} is neither empty nor a PostgreSQL data directory (no PG_VERSION); "
                "pass an empty or missing directory, or an initialized one"
            )
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._own_base is not None:
            self._give_to_server_user(self._own_base)
        self._give_to_server_user(self.data_dir)
        if self._run_as is not None:
            self._check_reachable(self.data_dir)
        cmd = [
            str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
            "--auth=trust", "--encoding=UTF8", "--locale=C",
        ]
        started = time.monotonic()
        out = subprocess.run(
            cmd, capture_output=True, text=True, env=self._env(), cwd=self.data_dir,
            timeout=120, **self._popen_identity(),
        )
        if out.returncode != 0:
            raise PostgresServerError(
                f"initdb failed (exit {out.returncode}) for {self.data_dir}:\n{out.stdout}{out.stderr}"
            )
        log.debug("initdb %s took %.2fs", self.data_dir, time.monotonic() - started)
        if self.trust_networks:
            with open(self.data_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
                hba.writelines(f"host all all {network} trust\n" for network in self.trust_networks)

    def _check_reachable(self, path: Path) -> None:
        """Fail early, with the reason, when the server's OS user cannot reach ``path``."""
        assert self._run_as is not None
        for parent in [*reversed(path.parents)]:
            st = parent.stat()
            if st.st_uid == self._run_as.pw_uid:
                continue
            if not st.st_mode & 0o001 and not (st.st_gid == self._run_as.pw_gid and st.st_mode & 0o010):
                raise PostgresServerError(
                    f"OS user {self._run_as.pw_name!r} cannot enter {parent} (mode {oct(st.st_mode & 0o777)}); "
                    "put the data directory somewhere it can reach, e.g. under /tmp"
                )

    def _command(self) -> list[str]:
        settings = {
            **self._settings,
            "listen_addresses": ",".join((self.host, *self.also_listen)),
            "port": self.port,
            "unix_socket_directories": str(self.data_dir),
        }
        cmd = [str(self._postgres), "-D", str(self.data_dir)]
        for key, value in settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def _spawn_and_wait(self) -> None:
        with open(self.log_path, "ab") as logf:
            mark = logf.tell()
            proc = subprocess.Popen(
                self._command(), stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=self._env(), cwd=self.data_dir, start_new_session=True, **self._popen_identity(),
            )
        with _live_lock:
            _live[proc] = (self.data_dir, self._postgres)
        self._proc = proc
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        while True:
            if proc.poll() is not None:
                _hard_kill(proc, self.data_dir, self._postgres)
                self._proc = None
                raise PostgresServerError(
                    f"PostgreSQL exited with code {proc.returncode} while starting on port {self.port}; "
                    f"log {self.log_path}:\n{self._log_since(mark)}"
                )
            try:
                conn = psycopg2.connect(self.dsn(), connect_timeout=5)
                conn.close()
                log.info("PostgreSQL ready on %s:%d (pid %d, data %s)", self.host, self.port, proc.pid, self.data_dir)
                return
            except psycopg2.OperationalError as exc:
                last_error = exc
            if time.monotonic() > deadline:
                self.kill()
                raise PostgresServerError(
                    f"PostgreSQL did not accept connections within {self.startup_timeout:.0f}s "
                    f"({last_error}); log {self.log_path}:\n{self._log_since(mark)}"
                )
            time.sleep(0.05)

    def _log_since(self, offset: int, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

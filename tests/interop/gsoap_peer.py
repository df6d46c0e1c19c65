"""A real gSOAP WS-RM peer for interop tests: build it, run its server, run its client.

The peer (sources in ``tests/interop/gsoap/``) is built from Debian's ``gsoap`` and
``libgsoap-dev`` packages: gSOAP's own WS-RM plugin (``plugin/wsrmapi.c``) does the
protocol, so the project is checked against an implementation it did not write.  It
serves and calls one interface (``gsoap/echo.h``), document/literal, elements
qualified in :data:`NAMESPACE`:

* ``Note(text)``, one-way, wsa:Action :data:`ACTION_NOTE`;
* ``Echo(text) -> text``, in-out, wsa:Action :data:`ACTION_ECHO` /
  :data:`ACTION_ECHO_RESPONSE`.

Two builds exist, chosen by ``version``: ``"1.1"`` (WS-RM 200702) and ``"1.0"``
(WS-RM 2005/02); both speak WS-Addressing 2005/08.  Messages the gSOAP side
originates are SOAP 1.2 unless asked otherwise; the server answers in the SOAP
version of each request.

Typical use::

    with GsoapServer("1.1") as server:            # builds once, then cached
        ...  # point the project's client at server.url
        assert server.wait_for_deliveries(20) == expected_texts

    result = run_gsoap_client("1.1", project_server_url, ["a", "b"])
    assert result.ok, result.stderr

Behaviour of the peer a test can rely on (and the gSOAP quirks it keeps) is written
in ``gsoap/README.md``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

WsrmVersion = Literal["1.0", "1.1"]
WSRM_VERSIONS: tuple[WsrmVersion, ...] = ("1.0", "1.1")

NAMESPACE = "http://example.org/wsrm-interop"
ACTION_NOTE = NAMESPACE + "/Note"
ACTION_ECHO = NAMESPACE + "/Echo"
ACTION_ECHO_RESPONSE = NAMESPACE + "/EchoResponse"
WSRM_NAMESPACE: dict[str, str] = {
    "1.0": "http://schemas.xmlsoap.org/ws/2005/02/rm",
    "1.1": "http://docs.oasis-open.org/ws-rx/wsrm/200702",
}
WSA_NAMESPACE = "http://www.w3.org/2005/08/addressing"

SOURCE_DIR = Path(__file__).resolve().parent / "gsoap"
GSOAP_SHARE = Path("/usr/share/gsoap")
INSTALL_HINT = "apt-get install -y gsoap libgsoap-dev make gcc pkg-config"

# Where the builds are cached (outside git: build/ is in .gitignore).
DEFAULT_BUILD_DIR = Path(os.environ.get("WSRM_GSOAP_BUILD_DIR", SOURCE_DIR / "build"))

SERVER_BINARY = "gsoap-wsrm-server"
CLIENT_BINARY = "gsoap-wsrm-client"

# Everything the binaries are made of: a change to any of these rebuilds.
_PEER_SOURCES = ("Makefile", "echo.h", "echo_wsrm10.h", "echo_wsrm11.h", "wsrm_compat.h",
                 "peer_common.h", "peer_common.c", "server.c", "client.c")
_GSOAP_INPUTS = ("plugin/wsrmapi.c", "plugin/wsrmapi.h", "plugin/wsaapi.c", "plugin/wsaapi.h",
                 "plugin/threads.h", "custom/duration.c", "import/wsrm.h", "import/wsrm5.h",
                 "import/wsrx.h", "import/wsrx5.h", "import/wsa5.h")


class GsoapUnavailable(RuntimeError):
    """The gSOAP toolchain is not installed; the message says what to install."""


class GsoapBuildError(RuntimeError):
    """soapcpp2 or the C compiler failed; the message holds the build log's tail."""


@dataclass(frozen=True)
class GsoapPeer:
    """One built peer: its binaries and the WSDL soapcpp2 wrote for ``echo.h``."""

    version: WsrmVersion
    directory: Path
    server: Path
    client: Path
    wsdl: Path


@dataclass(frozen=True)
class Delivery:
    """One message the gSOAP server handed to its application, in delivery order."""

    operation: str  # "Note" or "Echo"
    sequence: str  # the wsrm:Identifier the server assigned
    number: int  # wsrm:MessageNumber
    text: str


@dataclass(frozen=True)
class GsoapClientResult:
    """What ``gsoap-wsrm-client`` reported.

    ``returncode``: 0 all acknowledged and closed/terminated cleanly, 2 some
    message unacknowledged, 3 all acknowledged but close/terminate failed, 1 any
    other failure (stderr says which).
    """

    returncode: int
    sequence: str | None
    sent: int
    acked: int
    unacked: tuple[int, ...]
    close: str
    terminate: str
    responses: tuple[str, ...]
    stdout: str
    stderr: str = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _check_toolchain() -> None:
    missing = [tool for tool in ("soapcpp2", "make", "pkg-config") if shutil.which(tool) is None]
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        missing.append("a C compiler (cc/gcc)")
    if "pkg-config" not in missing:
        if subprocess.run(["pkg-config", "--exists", "gsoap"], check=False).returncode != 0:
            missing.append("pkg-config module gsoap (libgsoap-dev)")
    missing += [str(GSOAP_SHARE / name) for name in _GSOAP_INPUTS if not (GSOAP_SHARE / name).is_file()]
    if missing:
        raise GsoapUnavailable(
            "the gSOAP interop peer cannot be built, missing: " + ", ".join(missing)
            + f". Install with: {INSTALL_HINT}"
        )


def _source_hash(version: str) -> str:
    digest = hashlib.sha256(version.encode())
    for base, names in ((SOURCE_DIR, _PEER_SOURCES), (GSOAP_SHARE, _GSOAP_INPUTS)):
        for name in names:
            digest.update(name.encode() + b"\0" + (base / name).read_bytes() + b"\0")
    gsoap_version = subprocess.run(["pkg-config", "--modversion", "gsoap"], capture_output=True,
                                   text=True, check=False).stdout.strip()
    digest.update(gsoap_version.encode())
    return digest.hexdigest()[:16]


def _peer_in(directory: Path, version: WsrmVersion) -> GsoapPeer:
    return GsoapPeer(version=version, directory=directory, server=directory / SERVER_BINARY,
                     client=directory / CLIENT_BINARY, wsdl=directory / "gen" / "Echo.wsdl")


def _validate_version(version: str) -> WsrmVersion:
    if version not in WSRM_VERSIONS:
        raise ValueError(f"WS-RM version must be one of {WSRM_VERSIONS}, got {version!r}")
    return version  # type: ignore[return-value]


def build_gsoap_peer(version: WsrmVersion, outdir: Path | str | None = None) -> GsoapPeer:
    """Build (or reuse) the gSOAP server and client for one WS-RM version.

    Builds go to ``outdir/wsrm<version>-<hash of the sources and gSOAP files>``;
    an existing complete build is reused, so a test session compiles at most once
    per version.  Concurrent callers are serialized with a lock file, and a build
    only becomes visible once complete (rename), so a killed build leaves nothing
    half-made behind.

    Raises :class:`GsoapUnavailable` when the toolchain is missing and
    :class:`GsoapBuildError` when the build fails.
    """
    version = _validate_version(version)
    _check_toolchain()
    root = Path(outdir) if outdir is not None else DEFAULT_BUILD_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"wsrm{version}-{_source_hash(version)}"
    peer = _peer_in(final, version)
    if peer.server.is_file() and peer.client.is_file():
        return peer
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if peer.server.is_file() and peer.client.is_file():
            return peer
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            command = ["make", "-s", "-f", str(SOURCE_DIR / "Makefile"),
                       f"VERSION={version}", f"OUT={staging}", f"GSOAP={GSOAP_SHARE}"]
            log.info("building the gSOAP WS-RM %s peer in %s", version, final)
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            (staging / "build.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
                raise GsoapBuildError(f"building the gSOAP WS-RM {version} peer failed "
                                      f"(exit {done.returncode}): {' '.join(command)}\n{tail}")
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for stale in root.glob(f"wsrm{version}-*"):  # builds of sources that changed since
            if stale != final:
                shutil.rmtree(stale, ignore_errors=True)
    return peer


def unescape(text: str) -> str:
    """Undo the peer's one-line escaping (``\\\\``, ``\\t``, ``\\n``, ``\\r``)."""
    out: list[str] = []
    chars = iter(text)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, "")
        mapped = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}.get(nxt)
        if mapped is None:
            raise ValueError(f"bad escape \\{nxt} in gSOAP peer output line {text!r}")
        out.append(mapped)
    return "".join(out)


def parse_deliveries(content: str) -> list[Delivery]:
    """Parse the server's deliveries file (see ``gsoap/server.c``)."""
    deliveries = []
    for line in content.splitlines():
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError(f"malformed gSOAP deliveries line {line!r}")
        operation, sequence, number, text = fields
        deliveries.append(Delivery(operation, sequence, int(number), unescape(text)))
    return deliveries


def unused_tcp_port(host: str = "127.0.0.1") -> int:
    """A port free right now on ``host`` (for an AcksTo listener the client binds), below the
    ephemeral range (see :func:`wsrm_plugin.engine.transport.free_port`)."""
    from wsrm_plugin.engine.transport import free_port

    return free_port(host)


class GsoapServer:
    """The gSOAP WS-RM destination, running on ``host`` for the ``with`` block.

    ``port=0`` picks a free port (read :attr:`port` / :attr:`url` afterwards).
    ``hold_ms``: how long a message that arrives after a gap waits for the gap to
    fill before it is dropped unacknowledged (0 drops it at once).
    ``pulse_ms``: when set, the server also sends pending acks to addressable AcksTo
    endpoints every ``pulse_ms`` (gSOAP's ``soap_wsrm_pulse``).
    ``workdir``: where the deliveries file and the server log go; a temporary
    directory, removed on exit, when None.
    """

    def __init__(self, version: WsrmVersion = "1.1", port: int = 0, *, host: str = "127.0.0.1",
                 hold_ms: int = 2000, pulse_ms: int = 0, workdir: Path | str | None = None,
                 build_dir: Path | str | None = None, startup_timeout: float = 30.0) -> None:
        self.version = _validate_version(version)
        self.host = host
        self.port = port
        self.hold_ms = hold_ms
        self.pulse_ms = pulse_ms
        self.startup_timeout = startup_timeout
        self._build_dir = build_dir
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self.workdir: Path | None = None
        self._process: subprocess.Popen[str] | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        """The endpoint address to send WS-RM messages to."""
        return f"http://{self.host}:{self.port}/"

    @property
    def deliveries_path(self) -> Path:
        return self._require_workdir() / "deliveries.txt"

    @property
    def log_path(self) -> Path:
        return self._require_workdir() / "server.log"

    def _require_workdir(self) -> Path:
        if self.workdir is None:
            raise RuntimeError("the gSOAP server has not been started (use it in a with block)")
        return self.workdir

    def __enter__(self) -> GsoapServer:
        peer = build_gsoap_peer(self.version, self._build_dir)
        if self._workdir_arg is not None:
            self._workdir_arg.mkdir(parents=True, exist_ok=True)
            self.workdir = self._workdir_arg
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"gsoap-wsrm{self.version}-"))
        self.deliveries_path.write_text("")
        self._log_file = open(self.log_path, "w")
        command = [str(peer.server), "--deliveries", str(self.deliveries_path), "--host", self.host,
                   "--port", str(self.port), "--hold-ms", str(self.hold_ms),
                   "--pulse-ms", str(self.pulse_ms)]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log_file,
                                         text=True)
        try:
            self.port = self._read_ready_port()
        except BaseException:
            self._stop()
            raise
        log.info("gSOAP WS-RM %s server listening at %s", self.version, self.url)
        return self

    def _read_ready_port(self) -> int:
        assert self._process is not None and self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], self.startup_timeout)
        line = self._process.stdout.readline() if ready else ""
        if not line.startswith("READY "):
            self._process.poll()
            raise RuntimeError(f"the gSOAP server did not start (exit {self._process.returncode}, "
                               f"stdout {line!r}); its log:\n{self.log()}")
        return int(line.split()[1])

    def __exit__(self, *exc_info: object) -> None:
        self._stop()
        if self._workdir_arg is None and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def deliveries(self) -> list[Delivery]:
        """Every message delivered so far, in delivery order."""
        return parse_deliveries(self.deliveries_path.read_text())

    def texts(self) -> list[str]:
        """The delivered texts, in delivery order."""
        return [delivery.text for delivery in self.deliveries()]

    def wait_for_deliveries(self, count: int, timeout: float = 60.0) -> list[str]:
        """The delivered texts once at least ``count`` were delivered.

        ``timeout`` only guards against a hang: on expiry it returns what is
        there, for the test's own assertion to report.
        """
        deadline = time.monotonic() + timeout
        while True:
            texts = self.texts()
            if len(texts) >= count or time.monotonic() >= deadline or not self.running:
                return texts
            time.sleep(0.05)

    def log(self) -> str:
        """The server's stderr log so far (what it accepted, dropped, refused)."""
        if self.workdir is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")


def _parse_client_output(returncode: int, stdout: str, stderr: str) -> GsoapClientResult:
    sequence = None
    responses: list[str] = []
    summary: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("SEQUENCE "):
            sequence = line.split(" ", 1)[1]
        elif line.startswith("RESPONSE "):
            parts = line.split(" ", 2)
            responses.append(unescape(parts[2] if len(parts) > 2 else ""))
        elif line.startswith("SUMMARY "):
            summary = dict(item.split("=", 1) for item in line.split()[1:])
    if not summary:
        raise RuntimeError(f"the gSOAP client printed no SUMMARY (exit {returncode}); "
                           f"stdout:\n{stdout}\nstderr:\n{stderr}")
    unacked = summary.get("unacked", "-")
    return GsoapClientResult(
        returncode=returncode, sequence=sequence, sent=int(summary["sent"]),
        acked=int(summary["acked"]),
        unacked=() if unacked == "-" else tuple(int(n) for n in unacked.split(",")),
        close=summary.get("close", "-"), terminate=summary.get("terminate", "-"),
        responses=tuple(responses), stdout=stdout, stderr=stderr)


def run_gsoap_client(version: WsrmVersion, target_url: str, messages: Sequence[str], *,
                     acks_to: str | None = None, offer: bool = False,
                     operation: Literal["Note", "Echo"] = "Note",
                     soap_version: Literal["1.1", "1.2"] = "1.2",
                     behavior: str | None = None, resend_rounds: int = 3,
                     retry_ms: int = 200, max_retries: int = 50, request_timeout_s: int = 10,
                     timeout: float = 300.0, build_dir: Path | str | None = None,
                     extra_args: Sequence[str] = ()) -> GsoapClientResult:
    """Send ``messages`` to ``target_url`` in one WS-RM sequence with the gSOAP client.

    The client creates the sequence (with an Offer when ``offer``), sends each
    text as a ``Note`` (one-way) or ``Echo`` (in-out) with AckRequested, closes
    the sequence (1.1 CloseSequence, 1.0 LastMessage), resends what is
    unacknowledged (gSOAP's ``soap_wsrm_resend``, ``resend_rounds`` times),
    terminates, and reports.  ``acks_to`` (``http://host:port/``) makes AcksTo
    addressable: the client then listens there for the acks.  ``behavior`` is an
    IncompleteSequenceBehavior to offer (NoDiscard, DiscardEntireSequence,
    DiscardFollowingFirstGap).  ``timeout`` guards the whole run.
    """
    version = _validate_version(version)
    if operation not in ("Note", "Echo"):
        raise ValueError(f"operation must be 'Note' or 'Echo', got {operation!r}")
    if soap_version not in ("1.1", "1.2"):
        raise ValueError(f"soap_version must be '1.1' or '1.2', got {soap_version!r}")
    for text in messages:
        if "\0" in text:
            raise ValueError("a message for the gSOAP client cannot contain NUL characters")
    peer = build_gsoap_peer(version, build_dir)
    command = [str(peer.client), "--to", target_url, "--op", operation,
               "--resend-rounds", str(resend_rounds), "--retry-ms", str(retry_ms),
               "--max-retries", str(max_retries), "--timeout-s", str(request_timeout_s)]
    if acks_to:
        command += ["--acks-to", acks_to]
    if offer:
        command.append("--offer")
    if soap_version == "1.1":
        command.append("--soap11")
    if behavior:
        command += ["--behavior", behavior]
    command += [*extra_args, "--", *messages]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    result = _parse_client_output(done.returncode, done.stdout, done.stderr)
    log.info("gSOAP WS-RM %s client: exit %d, %d/%d acknowledged", version, result.returncode,
             result.acked, result.sent)
    return result


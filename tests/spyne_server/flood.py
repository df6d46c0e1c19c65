"""A connection flood from its own process: idle connections and requests that never finish.

``python -m tests.spyne_server.flood --port N --idle 2000 --half 500`` opens
``--idle`` TCP connections that send nothing and ``--half`` that send the
headers and the first bytes of a POST whose body never comes, prints
``FLOODING <connected> <attempted>`` once every attempt ended (connected,
refused or timed out), holds them until its stdin closes (or SIGTERM), then
closes them all and prints ``CLOSED``.  It raises its own RLIMIT_NOFILE as far
as the hard limit allows; a connection that does not complete within
``--connect-timeout`` seconds (the server's backlog full) is given up.
"""

from __future__ import annotations

import argparse
import errno
import resource
import select
import signal
import socket
import sys
import threading
import time

HALF_SENT = (b"POST / HTTP/1.1\r\nHost: flood\r\nContent-Type: text/xml\r\nContent-Length: 100000\r\n\r\n"
             b"<soap:Envelope")


def _raise_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def flood(port: int, count: int, first: bytes, connect_timeout: float) -> list[socket.socket]:
    """Connect ``count`` non-blocking sockets at once; those connected within the timeout, ``first`` sent."""
    pending: dict[int, socket.socket] = {}
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            continue
        pending[sock.fileno()] = sock
    connected: list[socket.socket] = []
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + connect_timeout
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            sock = pending.pop(fd)
            poller.unregister(fd)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                sock.close()
                continue
            if first:
                try:
                    sock.send(first)
                except OSError:
                    sock.close()
                    continue
            connected.append(sock)
    for sock in pending.values():
        sock.close()
    return connected


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--idle", type=int, default=2000)
    p.add_argument("--half", type=int, default=500)
    p.add_argument("--connect-timeout", type=float, default=10.0)
    args = p.parse_args()
    _raise_nofile(args.idle + args.half + 100)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    idle = flood(args.port, args.idle, b"", args.connect_timeout)
    half = flood(args.port, args.half, HALF_SENT, args.connect_timeout)
    print(f"FLOODING {len(idle) + len(half)} {args.idle + args.half}", flush=True)
    stop.wait()
    for sock in idle + half:
        sock.close()
    print("CLOSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run a benchmark as if on a quiet disk: its files on tmpfs, every fsync taking a fixed time.

On the shared 2-core machine the other helpers' test suites keep the one disk busy: an
``fdatasync`` there takes 3-6 ms (against about 0.4 ms quiet), and every path that waits for
flushes one after another (a SQLite service delivering inside its file, whose method commits
to PostgreSQL while holding it) reads as slow as the disk happens to be.  This runs a command
with ``TMPDIR`` on tmpfs (the benchmarks put their SQLite files and their throwaway PostgreSQL
server there) and an ``LD_PRELOAD`` shim that makes each ``fsync``/``fdatasync`` of the
command's processes, PostgreSQL's included, take ``--delay-us`` microseconds after the real call
(a sleep: concurrent flushes overlap, as on a disk with a deep queue).  ``--nice`` raises the
command's CPU priority (root only), so the other helpers' processes take less of the cores.

A model, not a measurement of this machine's disk: compare scenarios within one run under it
(the same rounds, the same delay), and say the delay with the figures.  Run::

    .venv/bin/python bench/quiet_disk.py [--delay-us 400] [--nice 19] -- \\
        .venv/bin/python bench/bench_compare.py --clients 16 --scenarios plainN,sqlite

Needs a C compiler (``cc``) and a tmpfs (``/dev/shm``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The shim: the real call, then the delay (FSYNC_DELAY_US microseconds).
_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
static void delay(void) {
    const char *s = getenv("FSYNC_DELAY_US");
    long us = s ? atol(s) : 0;
    struct timespec t = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&t, &t)) {}
}
int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int r = real(fd); delay(); return r;
}
int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int r = real(fd); delay(); return r;
}
"""


def build_shim(directory: Path) -> Path:
    """Compile the shim into ``directory``; its path."""
    source, library = directory / "fsync_delay.c", directory / "fsync_delay.so"
    source.write_text(_SHIM)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"], check=True)
    return library


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-us", type=int, default=400, help="microseconds each fsync/fdatasync takes")
    parser.add_argument("--tmpfs", default="/dev/shm", help="a tmpfs directory for the command's files")
    parser.add_argument("--nice", type=int, default=0, help="raise the command's CPU priority by this much")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    with tempfile.TemporaryDirectory(prefix="quiet-disk-", dir=args.tmpfs) as work:
        os.chmod(work, 0o755)  # a throwaway PostgreSQL server runs as its own OS user: it must enter
        env = dict(os.environ, TMPDIR=work, FSYNC_DELAY_US=str(args.delay_us))
        env["LD_PRELOAD"] = " ".join(filter(None, (str(build_shim(Path(work))), env.get("LD_PRELOAD"))))
        if args.nice:
            command = ["nice", "-n", str(-args.nice), *command]
        print(f"quiet disk: files under {work} (tmpfs), each fsync {args.delay_us} us, nice -{args.nice}",
              flush=True)
        return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())

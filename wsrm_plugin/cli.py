"""The ``wsrm`` command: demos and operator tools.

Each subcommand's options and behaviour live in its own module
(``add_arguments(parser)`` and ``run(args)``), so this file only assembles them.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wsrm", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    from wsrm_plugin import __version__
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from txmanager import operator

    from wsrm_plugin import status_command
    from wsrm_plugin.tools import demo, txdemo

    p = sub.add_parser("demo", help="the main job: the end-to-end WS-RM demo on embedded defaults",
                       description=demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_arguments(p)
    p.set_defaults(run=demo.run)

    p = sub.add_parser("status", help="sequences and counters of a message store (or Prometheus metrics)",
                       description=status_command.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    status_command.add_arguments(p)
    p.set_defaults(run=status_command.run)

    from wsrm_plugin import resend

    p = sub.add_parser("resend", help="send a faulted sequence's messages again on a new sequence",
                       description=resend.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    resend.add_arguments(p)
    p.set_defaults(run=resend.run)
    from wsrm_plugin import poison

    p = sub.add_parser("poison", help="list, show, retry or discard messages in the poison store",
                       description=poison.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    poison.add_arguments(p)
    p.set_defaults(run=poison.run)

    p = sub.add_parser("txdemo", help="two PostgreSQL banks, crashes at every 2PC point, recovery",
                       description=txdemo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    txdemo.add_arguments(p)
    p.set_defaults(run=lambda a: txdemo.run(a.dsn, a.transfers))

    p = sub.add_parser("recover", help="list and resolve in-doubt transactions",
                       description=operator.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    operator.add_arguments(p)
    p.set_defaults(run=operator.run)

    from txmanager import nodes_status

    p = sub.add_parser("nodes", help="which host holds which node name (several hosts on one store)",
                       description=nodes_status.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    nodes_status.add_arguments(p)
    p.set_defaults(run=nodes_status.run)

    from wsrm_plugin.tools import proxy

    p = sub.add_parser("proxy", help="lossy loopback HTTP proxy for fault injection",
                       description=proxy.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    proxy.add_arguments(p)
    p.set_defaults(run=proxy.run)

    from wsrm_plugin.spark import cli as spark_cli

    p = sub.add_parser("send", help="run the RMS sender over a shared store (Spark jobs' messages)",
                       description=spark_cli.send.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    spark_cli.send.add_arguments(p)
    p.set_defaults(run=spark_cli.send.run)

    p = sub.add_parser("spark-recover", help="finish a Spark job after a crash (commit or roll back "
                       "its prepared branches)", description=spark_cli.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    spark_cli.add_recover_arguments(p)
    p.set_defaults(run=spark_cli.run_recover)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

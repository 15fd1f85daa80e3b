"""``streamfer demo``, a command the dev package adds to the ``streamfer`` command line.

pyproject.toml registers ``add_demo`` in the entry-point group ``streamfer.commands``,
which ``worker.cli.plugins`` reads, so the runtime never names this package. Importing
this module is cheap and needs no extra: the demo, and the ``demo`` extra it needs, load
only when the command runs, and a missing requirement is named with the pip command that
brings it.
"""

from __future__ import annotations

import argparse
import logging
import sys

from worker.core import install_command
from worker.errors import StreamferError

__all__ = ["add_demo", "cmd_demo"]


def add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` and its flags to ``streamfer``'s commands."""
    demo = sub.add_parser("demo", help="start a local stack and stream requests through workers")
    demo.add_argument(
        "--broker",
        choices=["auto", "kafka", "tansu", "external"],
        default="auto",
        help="auto: Apache Kafka when Java is present, else Tansu; external: "
        "KAFKA_BOOTSTRAP_SERVERS [env]",
    )
    demo.add_argument("--records", type=int, default=20_000, help="requests to produce (20,000)")
    demo.add_argument("--workers", type=int, default=2, help="worker processes to start (2)")
    demo.add_argument(
        "--partitions", type=int, default=4, help="partitions of the request topic (4)"
    )
    demo.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="requests per second; 0 produces as fast as possible",
    )
    demo.add_argument(
        "--bad-fraction",
        type=float,
        default=0.01,
        help="share of deliberately bad requests (they become dead letters)",
    )
    demo.add_argument(
        "--share-group",
        action="store_true",
        help="workers join one share group (KIP-932): more workers than partitions all "
        "work; Apache Kafka only",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo and print its report. Exit 0 when no record was lost, 1 when one was
    or the stack failed, 2 when the ``demo`` extra is missing."""
    # The demo's dependencies come with the demo extra.
    try:
        from streamfer_dev import missing_requirements
        from streamfer_dev.demo import DemoOptions, print_report, run_demo

        missing = missing_requirements()
    except ImportError as exc:
        missing = [exc.name or "streamfer_dev"]
    if missing:
        print(
            f"streamfer demo needs the demo extra (missing {', '.join(missing)}): "
            f"{install_command('demo')}",
            file=sys.stderr,
        )
        return 2
    from worker.ops import setup_logging

    setup_logging("text", logging.WARNING if args.json else logging.INFO)
    try:
        report = run_demo(
            DemoOptions(
                broker=args.broker,
                records=args.records,
                workers=args.workers,
                partitions=args.partitions,
                rate=args.rate,
                bad_fraction=args.bad_fraction,
                share_group=args.share_group,
            )
        )
    except StreamferError as exc:
        print(f"streamfer demo: {exc}", file=sys.stderr)
        return 1
    print_report(report, as_json=args.json)
    return 0 if report["lost"] == 0 else 1

"""The ``streamfer`` command line: run a worker, check a config, run the demo.

Signal handlers only set a flag: the first SIGTERM or SIGINT asks the worker to drain,
commit and leave the group; a second one exits at once (uncommitted records are then
consumed again by the group).

Exit codes: 0 clean stop, 1 the worker failed, 2 bad configuration or usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from worker import __version__
from worker.errors import ConfigError, StreamferError

__all__ = ["main"]

log = logging.getLogger("streamfer")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    code: int = args.func(args)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamfer", description="Kafka stream-processing inference worker."
    )
    parser.add_argument("--version", action="version", version=f"streamfer {__version__}")
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run one worker of the consumer group")
    run.add_argument(
        "--config",
        required=True,
        help="TOML config file [env: STREAMFER_CONFIG]",
        default=os.environ.get("STREAMFER_CONFIG"),
    )
    run.add_argument(
        "--burst-idle-s",
        type=float,
        default=None,
        help="drain and exit after this many seconds without records",
    )
    run.set_defaults(func=_cmd_run)

    check = sub.add_parser("check", help="validate a config, load its models, reach Redis")
    check.add_argument("--config", required=True)
    check.set_defaults(func=_cmd_check)

    demo = sub.add_parser("demo", help="start a local stack and stream requests through workers")
    demo.add_argument(
        "--broker",
        choices=["auto", "kafka", "tansu", "external"],
        default="auto",
        help="auto: Apache Kafka when Java is present, else Tansu; external: "
        "KAFKA_BOOTSTRAP_SERVERS [env]",
    )
    demo.add_argument("--records", type=int, default=20_000)
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--partitions", type=int, default=4)
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
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from worker.app import Worker
    from worker.config import load_config
    from worker.logs import setup_logging

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"streamfer: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_format)
    try:
        worker = Worker.from_config(config)
    except StreamferError as exc:
        log.error("cannot start: %s", exc)
        return 2 if isinstance(exc, ConfigError) else 1
    if config.metrics.port is not None:
        from worker.health import HealthServer

        server = HealthServer(
            worker.health, worker.metrics.registry, config.metrics.host, config.metrics.port
        ).start()
        log.info("metrics, /healthz and /readyz on http://%s:%d", config.metrics.host, server.port)
    _install_signal_handlers(worker.stop)
    log.info(
        "streamfer %s: group %s, pipelines %s",
        __version__,
        config.kafka.group_id,
        [p.name for p in config.pipelines],
    )
    try:
        worker.run(burst_idle_s=args.burst_idle_s)
    except StreamferError as exc:
        log.error("worker stopped: %s", exc)
        return 1
    log.info("stopped cleanly")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.engines import OnnxEngine
    from worker.features import RedisHashStore

    try:
        config = load_config(args.config)
        for p in config.pipelines:
            engine = OnnxEngine(p.model)
            store = RedisHashStore.connect(config.redis, p.features)
            store.ping()
            print(
                f"ok: pipeline {p.name}: model {p.model.name} ({engine.model_hash[:12]}), "
                f"{len(p.features.fields)} features"
            )
    except StreamferError as exc:
        print(f"streamfer: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from worker.demo import DemoOptions, print_report, run_demo
    from worker.logs import setup_logging

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
            )
        )
    except StreamferError as exc:
        print(f"streamfer demo: {exc}", file=sys.stderr)
        return 1
    print_report(report, as_json=args.json)
    return 0 if report["lost"] == 0 else 1


def _install_signal_handlers(stop: object) -> None:
    assert callable(stop)
    state = {"signals": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        state["signals"] += 1
        if state["signals"] > 1:
            os._exit(128 + signum)
        log.info("signal %d: draining; send again to exit at once", signum)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


if __name__ == "__main__":
    raise SystemExit(main())

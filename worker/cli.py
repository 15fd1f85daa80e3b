"""The ``streamfer`` command line: run a worker, check a config, run the demo, replay a
slice of history, show or reset a group's offsets, and inspect or optimize a model.

Signal handlers only set a flag: the first SIGTERM or SIGINT asks the worker to drain,
commit and leave the group; a second one exits at once (uncommitted records are then
consumed again by the group). SIGHUP asks it to look for a new model version now
(``worker.models.reloader``). ``run --processes N`` runs a supervisor of N workers
(``worker.ops.supervisor``), which forwards the first signal to them and SIGKILLs them on the
second, and forwards every SIGHUP; a worker it started drains on a signal and leaves
repeats to it.

Exit codes: 0 clean stop, 1 the worker failed, 2 bad configuration or usage.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from worker.core.version import __version__
from worker.errors import CallStalled, ConfigError, StreamferError

if TYPE_CHECKING:
    from worker.config import WorkerConfig

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


def _config_argument(parser: argparse.ArgumentParser) -> None:
    """``--config``, which ``STREAMFER_CONFIG`` supplies when it is not given (read when
    the command line is parsed, as a container sets it)."""
    default = os.environ.get("STREAMFER_CONFIG") or None
    parser.add_argument(
        "--config",
        required=default is None,
        default=default,
        type=Path,
        help="TOML config file [env: STREAMFER_CONFIG]",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamfer", description="Kafka stream-processing inference worker."
    )
    parser.add_argument("--version", action="version", version=f"streamfer {__version__}")
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run one worker of the consumer group")
    _config_argument(run)
    run.add_argument(
        "--burst-idle-s",
        type=float,
        default=None,
        help="drain and exit after this many seconds without records",
    )
    run.add_argument(
        "--processes",
        metavar="N",
        default=None,
        help="worker processes on this host, each a member of the group: a number, or "
        "auto for the usable cores; more than 1 runs a supervisor that restarts them and "
        "serves their metrics and probes as one (default 1) [env: STREAMFER_PROCESSES]",
    )
    run.set_defaults(func=_cmd_run)

    check = sub.add_parser(
        "check",
        help="validate a config and run one batch of each pipeline through decode, enrich "
        "(real Redis), infer and result encoding, producing nothing",
    )
    _config_argument(check)
    check.add_argument(
        "--print-config", action="store_true", help="print the effective config, secrets masked"
    )
    check.add_argument(
        "--skip-kafka",
        action="store_true",
        help="check the models and the feature store only (no cluster reachable from here)",
    )
    check.add_argument(
        "--kafka-timeout", type=float, default=10.0, help="seconds per Kafka request (10)"
    )
    check.add_argument("--json", action="store_true", help="one JSON object: every check")
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
    _add_replay_commands(sub)
    _add_feature_commands(sub)
    _add_model_commands(sub)
    return parser


def _add_replay_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replay`` and ``offsets``; their work is in worker.replay and worker.tools.offsets."""
    replay = sub.add_parser(
        "replay",
        help="re-run a bounded slice of a pipeline's request topics into a replay topic",
        description="Bounds are [from, to): starts inclusive, ends exclusive. Exit codes: "
        "0 complete, 1 failed, 2 bad usage, 3 stopped early (resume with --resume ID).",
    )
    _config_argument(replay)
    replay.add_argument("--pipeline", help="pipeline name (optional with one pipeline)")
    start = replay.add_mutually_exclusive_group()
    start.add_argument("--from-time", help="ISO-8601 (UTC unless zoned) or epoch ms; inclusive")
    start.add_argument("--from-offset", help="OFFSET for every partition, or P:OFFSET,...")
    end = replay.add_mutually_exclusive_group()
    end.add_argument("--to-time", help="ISO-8601 or epoch ms; exclusive")
    end.add_argument("--to-offset", help="OFFSET or P:OFFSET,...; exclusive")
    replay.add_argument("--partitions", help="only these partitions, e.g. 0,2,5-7")
    replay.add_argument("--output-topic", help="default <result_topic>.replay.<model_version>")
    replay.add_argument(
        "--dead-letter-topic", help="default <dead_letter_topic>.replay.<model_version>"
    )
    replay.add_argument(
        "--model", type=Path, help="another ONNX file than live (needs --model-version)"
    )
    replay.add_argument("--model-version", help="version stamped on results and in the topic name")
    replay.add_argument("--max-rate", type=float, help="records per second (default: unbounded)")
    replay.add_argument(
        "--nice",
        type=int,
        default=10,
        help="raise this process's niceness so live workers on the host come first (0: off)",
    )
    replay.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".streamfer/replays"),
        help="where replay plans are kept (default .streamfer/replays)",
    )
    ident = replay.add_mutually_exclusive_group()
    ident.add_argument("--replay-id", help="id of a new replay (default: random)")
    ident.add_argument("--resume", metavar="ID", help="continue replay ID where it stopped")
    replay.add_argument(
        "--dry-run",
        action="store_true",
        help="print the per-partition ranges and record counts, read nothing",
    )
    replay.add_argument(
        "--json", action="store_true", help="no progress bar; print the summary as one JSON object"
    )
    replay.set_defaults(func=_cmd_replay)

    offsets = sub.add_parser("offsets", help="show or reset a consumer group's offsets")
    osub = offsets.add_subparsers(dest="offsets_command", required=True)
    show = osub.add_parser(
        "show", help="committed, log end and lag (records, seconds) per partition"
    )
    reset = osub.add_parser("reset", help="move a stopped group's offsets")
    for p in (show, reset):
        _config_argument(p)
        p.add_argument("--group", help="another group than the config's (a replay's, say)")
        p.add_argument("--pipeline", help="only this pipeline's request topics")
    show.add_argument("--json", action="store_true")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-time", help="first record at or after: ISO-8601 or epoch ms")
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    reset.add_argument("--partitions", help="only these partitions, e.g. 0,2,5-7")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    offsets.set_defaults(func=_cmd_offsets)


def _add_feature_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    features = sub.add_parser("features", help="manage the features a pipeline reads")
    fsub = features.add_subparsers(dest="features_command", required=True)
    load = fsub.add_parser("load", help="write features from CSV or Parquet into Redis")
    _config_argument(load)
    load.add_argument("--pipeline", help="pipeline whose lookups to use (default: the first)")
    load.add_argument("--lookup", help="the lookup to write (default: the pipeline's first)")
    load.add_argument("--file", required=True, type=Path, help=".csv, .tsv or .parquet")
    load.add_argument("--entity-column", default="entity")
    load.add_argument(
        "--layout",
        choices=["hash", "packed"],
        default=None,
        help="default: the lookup's layout",
    )
    load.add_argument("--chunk", type=int, default=5000, help="rows per pipelined write")
    load.add_argument("--no-progress", action="store_true")
    load.set_defaults(func=_cmd_features_load)


def _add_model_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``model inspect`` and ``model optimize``; their work is in worker.tools.model_inspect and
    worker.tools.model_optimize (they need the tools extra)."""
    model = sub.add_parser("model", help="inspect an ONNX model, or make an FP16 or INT8 copy")
    msub = model.add_subparsers(dest="model_command", required=True)
    inspect = msub.add_parser(
        "inspect", help="inputs, outputs, opsets, and which execution providers load it"
    )
    inspect.add_argument("file", type=Path, help="the .onnx file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(func=_cmd_model_inspect)
    optimize = msub.add_parser(
        "optimize",
        help="an FP16 or INT8 copy, compared with the FP32 model on held-out rows",
        description="CSV rows: a header, then columns filling the model's inputs in its "
        "input order. Exit codes: 0 written, 1 refused (the label drop exceeds --max-drop; "
        "nothing written) or failed, 2 bad usage or input.",
    )
    optimize.add_argument("file", type=Path, help="the FP32 .onnx file")
    mode = optimize.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--fp16", dest="mode", action="store_const", const="fp16", help="float16 weights and ops"
    )
    mode.add_argument(
        "--int8", dest="mode", action="store_const", const="int8", help="int8 quantization"
    )
    optimize.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE.csv",
        help="CSV rows: INT8 calibrates on them (static; without them, dynamic), "
        "holding every 5th out to compare on unless --eval is given",
    )
    optimize.add_argument("--eval", type=Path, metavar="FILE.csv", help="CSV rows to compare on")
    optimize.add_argument(
        "--output",
        type=Path,
        metavar="PATH",
        help="default <stem>.fp16.onnx / <stem>.int8.onnx beside FILE",
    )
    optimize.add_argument(
        "--max-drop",
        type=float,
        default=0.01,
        metavar="SHARE",
        help="largest share of rows whose label may change (0.01)",
    )
    optimize.add_argument(
        "--speed-s", type=float, default=2.0, metavar="S", help="seconds of timing per model (2)"
    )
    optimize.add_argument("--json", action="store_true", help="print the report as JSON")
    optimize.set_defaults(func=_cmd_model_optimize)


def _cmd_model_inspect(args: argparse.Namespace) -> int:
    import orjson

    from worker.tools.model_inspect import inspect_model

    try:
        info = inspect_model(args.file)
    except StreamferError as exc:
        return _failed("streamfer model inspect", exc)
    print(orjson.dumps(info.as_dict()).decode() if args.json else info.text())
    return 0


def _cmd_model_optimize(args: argparse.Namespace) -> int:
    import orjson

    from worker.tools.model_optimize import OptimizeOptions, optimize_model

    options = OptimizeOptions(
        mode=args.mode,
        calibration=args.calibration,
        eval_rows=args.eval,
        output=args.output,
        max_drop=args.max_drop,
        speed_seconds=args.speed_s,
    )
    try:
        outcome = optimize_model(args.file, options)
    except StreamferError as exc:
        return _failed("streamfer model optimize", exc)
    print(orjson.dumps(outcome.as_dict()).decode() if args.json else outcome.text())
    if outcome.refused:
        print(f"streamfer model optimize: {outcome.refused}", file=sys.stderr)
        return 1
    return 0


def _cmd_features_load(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.features.redis_io import redis_client
    from worker.tools.feature_loader import load_features

    try:
        config = load_config(args.config)
        pipeline = (
            config.pipeline(args.pipeline) if args.pipeline is not None else config.pipelines[0]
        )
        lookups = {lk.name: lk for lk in pipeline.lookups}
        name = args.lookup if args.lookup is not None else next(iter(lookups), None)
        if name not in lookups:
            raise ConfigError(
                f"pipeline {pipeline.name!r} has no lookup {name!r}; it has {list(lookups)}"
            )
        client = redis_client(config.redis)
        report = load_features(
            client,
            lookups[name],
            args.file,
            entity_column=args.entity_column,
            layout=args.layout,
            chunk=args.chunk,
            progress=not args.no_progress,
        )
        client.close()
    except StreamferError as exc:
        return _failed("streamfer", exc)
    print(
        f"loaded {report.rows} entities ({report.layout}) in {report.seconds:.2f}s, "
        f"{report.rows_per_s:,.0f} rows/s"
    )
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from worker.compose import build_worker
    from worker.config import load_config
    from worker.ops.health import HealthServer, HealthState
    from worker.ops.logs import setup_logging
    from worker.ops.supervisor import (
        PROCESSES_ENV,
        follow_supervisor,
        parse_processes,
        supervised_index,
    )

    given = args.processes is not None
    try:
        processes = parse_processes(args.processes if given else os.environ.get(PROCESSES_ENV, "1"))
    except ConfigError as exc:
        where = "--processes" if given else f"{PROCESSES_ENV} (the default of --processes)"
        print(f"streamfer: {where}: {exc}", file=sys.stderr)
        return 2
    index = supervised_index(os.environ)
    if index is not None and not follow_supervisor(os.environ):
        print("streamfer: the supervisor that started this worker is gone", file=sys.stderr)
        return 1
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"streamfer: {exc}", file=sys.stderr)
        return 2
    if processes > 1 and index is None:
        return _run_supervisor(args, config, processes)
    reload_requests = threading.Event()
    _install_reload_signal(reload_requests.set)
    setup_logging(
        config.log_format, getattr(logging, config.log_level.upper()), process_index=index
    )
    # Probes answer from the start: /readyz says why not ready while models load and
    # until a broker answers.
    registry = CollectorRegistry()
    health = HealthState(liveness_timeout_s=config.liveness_timeout_s)
    if config.metrics.port is not None:
        reload = reload_requests.set if config.metrics.reload_endpoint else None
        server = HealthServer(
            health, registry, config.metrics.host, config.metrics.port, reload=reload
        ).start()
        log.info(
            "metrics, /healthz and /readyz%s on http://%s:%d",
            " (and POST /reload)" if reload is not None else "",
            config.metrics.host,
            server.port,
        )
    try:
        worker = build_worker(config, registry, health, reload_requests)
    except CallStalled as exc:
        _exit_stalled("cannot start", exc)
    except StreamferError as exc:
        log.error("cannot start: %s", exc)
        return 2 if isinstance(exc, ConfigError) else 1
    _install_signal_handlers(worker.stop, repeat_exits=index is None)
    log.info(
        "streamfer %s: group %s, pipelines %s",
        __version__,
        config.kafka.group_id,
        [p.name for p in config.pipelines],
    )
    try:
        worker.run(burst_idle_s=args.burst_idle_s)
    except CallStalled as exc:
        _exit_stalled("worker stopped", exc)
    except StreamferError as exc:
        log.error("worker stopped: %s", exc)
        return 1
    log.info("stopped cleanly")
    return 0


def _exit_stalled(what: str, exc: CallStalled) -> NoReturn:
    """End the process now, exit code 1: a Kafka client is stuck inside a call, and the
    interpreter's clean exit would wait on it for good (closing the client joins the
    stuck call). Nothing is lost: the stuck transaction never commits, and the restarted
    worker (supervisor, Kubernetes) starts from the committed offsets."""
    log.error("%s: %s; exiting without closing the Kafka clients", what, exc)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _run_supervisor(args: argparse.Namespace, config: WorkerConfig, processes: int) -> int:
    """``run --processes N``: N workers of the group under one supervisor, whose merged
    /metrics, /healthz and /readyz take the configured address."""
    from prometheus_client import CollectorRegistry

    from worker.ops.health import HttpEndpoint, reload_response
    from worker.ops.logs import setup_logging
    from worker.ops.metrics_merge import MergedEndpoints
    from worker.ops.supervisor import Supervisor, plan_for

    setup_logging(config.log_format, getattr(logging, config.log_level.upper()))
    registry = CollectorRegistry()
    plan = plan_for(
        config, args.config, processes, burst_idle_s=args.burst_idle_s, environ=os.environ
    )
    supervisor = Supervisor(plan, registry)
    _install_signal_handlers(supervisor.signalled, repeat_exits=False)
    _install_reload_signal(supervisor.request_reload)
    merged: MergedEndpoints | None = None
    server: HttpEndpoint | None = None
    if config.metrics.port is not None:
        merged = MergedEndpoints(
            supervisor.children,
            registry,
            stopping=lambda: supervisor.stopping,
            threads=min(64, 2 * processes),
        )
        post = (
            reload_response(supervisor.request_reload) if config.metrics.reload_endpoint else None
        )
        try:
            server = HttpEndpoint(
                merged.respond, config.metrics.host, config.metrics.port, post=post
            )
        except OSError as exc:
            where = f"{config.metrics.host}:{config.metrics.port}"
            log.error("cannot serve metrics on %s (metrics.host, metrics.port): %s", where, exc)
            return 1
        server.start()
        log.info(
            "supervisor: metrics, /healthz and /readyz of %d processes on http://%s:%d",
            processes,
            config.metrics.host,
            server.port,
        )
    log.info(
        "streamfer %s: supervising %d worker processes of group %s",
        __version__,
        processes,
        config.kafka.group_id,
    )
    try:
        return supervisor.run()
    finally:
        if server is not None:
            server.stop()
        if merged is not None:
            merged.close()


def _cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when every check passed, 1 when a Kafka check failed (each named on its
    line), 2 when the config, a model or the feature store cannot serve."""
    import orjson

    from worker.config import load_config, redacted
    from worker.tools.check import check_pipeline
    from worker.tools.kafka_check import CheckLine, check_kafka

    lines: list[CheckLine] = []
    try:
        config = load_config(args.config)
        if args.print_config:
            print(orjson.dumps(redacted(config), option=orjson.OPT_INDENT_2).decode())
        for p in config.pipelines:
            checked = check_pipeline(p, config.redis)
            lines.append(
                CheckLine(
                    f"pipeline {p.name}",
                    True,
                    f"model {p.model.name} ({checked.model_hash[:12]}), "
                    f"{len(p.lookups)} lookups; one batch through decode, enrich, "
                    f"infer and encode: a {checked.result_bytes}-byte result; the lookup of a "
                    f"probe entity gave {checked.lookup_outcome}",
                )
            )
            # the model's signature and how each input is fed, a line each
            lines += [CheckLine(f"pipeline {p.name} model", True, s) for s in checked.signature]
            if not args.json:
                for line in lines[-1 - len(checked.signature) :]:
                    print(line.text(), flush=True)
    except StreamferError as exc:
        print(f"streamfer: {exc}", file=sys.stderr)
        return 2
    if not args.skip_kafka:
        for line in check_kafka(config, timeout=args.kafka_timeout):
            lines.append(line)
            if not args.json:
                print(line.text(), flush=True)
    failed = [line.name for line in lines if not line.ok]
    if args.json:
        doc = {"ok": not failed, "checks": [line.as_dict() for line in lines]}
        print(orjson.dumps(doc).decode())
    if failed:
        print(f"streamfer check: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    # The demo lives in the dev package; its dependencies come with the demo extra.
    try:
        from streamfer_dev import missing_requirements
        from streamfer_dev.demo import DemoOptions, print_report, run_demo

        missing = missing_requirements()
    except ImportError as exc:
        missing = [exc.name or "streamfer_dev"]
    if missing:
        print(
            f"streamfer demo needs the demo extra (missing {', '.join(missing)}): "
            "pip install 'streamfer[demo]'",
            file=sys.stderr,
        )
        return 2
    from worker.ops.logs import setup_logging

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


def _cmd_replay(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.ops.logs import setup_logging
    from worker.replay import ReplayOptions, run_replay
    from worker.tools.offsets import parse_partitions, parse_time
    from worker.tools.ranges import Bounds, parse_offset_bound

    try:
        config = load_config(args.config)
        bounded = [args.from_time, args.to_time, args.from_offset, args.to_offset]
        changed = [
            args.partitions,
            args.output_topic,
            args.dead_letter_topic,
            args.model,
            args.model_version,
            args.pipeline,
        ]
        if args.resume and any(v is not None for v in bounded + changed):
            raise ConfigError(
                "--resume takes the plan it saved; give only --max-rate, --nice, "
                "--state-dir, --dry-run and --json with it"
            )
        bounds = Bounds(
            from_time_ms=parse_time(args.from_time) if args.from_time else None,
            to_time_ms=parse_time(args.to_time) if args.to_time else None,
            from_offset=parse_offset_bound(args.from_offset) if args.from_offset else None,
            to_offset=parse_offset_bound(args.to_offset) if args.to_offset else None,
            partitions=tuple(parse_partitions(args.partitions)) if args.partitions else None,
        )
        if args.max_rate is not None and args.max_rate <= 0:
            raise ConfigError("--max-rate must be positive")
        options = ReplayOptions(
            pipeline=args.pipeline,
            bounds=bounds,
            output_topic=args.output_topic,
            dead_letter_topic=args.dead_letter_topic,
            model_path=args.model,
            model_version=args.model_version,
            max_rate=args.max_rate,
            nice=args.nice,
            state_dir=args.state_dir,
            replay_id=args.replay_id,
            resume=args.resume,
            dry_run=args.dry_run,
            progress=not args.json,
        )
        setup_logging(config.log_format, logging.WARNING if args.json else logging.INFO)
        return run_replay(
            config,
            options,
            on_start=lambda replay: _install_signal_handlers(replay.stop),
            as_json=args.json,
        )
    except StreamferError as exc:
        return _failed("streamfer replay", exc)


def _cmd_offsets(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.tools.offsets import (
        ResetTarget,
        parse_partitions,
        parse_time,
        reset_command,
        show_command,
    )

    try:
        config = load_config(args.config)
        if args.offsets_command == "show":
            return show_command(
                config, group=args.group, pipeline=args.pipeline, as_json=args.json, out=sys.stdout
            )
        if args.to_time:
            target = ResetTarget("time", parse_time(args.to_time))
        else:
            target = ResetTarget("earliest" if args.to_earliest else "latest")
        return reset_command(
            config,
            target,
            group=args.group,
            pipeline=args.pipeline,
            partitions=parse_partitions(args.partitions) if args.partitions else None,
            yes=args.yes,
            out=sys.stdout,
        )
    except StreamferError as exc:
        return _failed("streamfer offsets", exc)


def _failed(command: str, exc: StreamferError) -> int:
    """Say what went wrong; exit 2 for bad configuration or arguments, 1 otherwise."""
    print(f"{command}: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, ConfigError) else 1


def _install_signal_handlers(stop: object, *, repeat_exits: bool = True) -> None:
    """SIGTERM and SIGINT call ``stop``; with ``repeat_exits`` a second one exits at once,
    without it every one calls ``stop`` (a supervisor counts them; a worker it started
    leaves the hard stop to it, which a process manager signalling the whole group twice
    must not trigger)."""
    assert callable(stop)
    state = {"signals": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        state["signals"] += 1
        if state["signals"] > 1 and repeat_exits:
            os._exit(128 + signum)
        if state["signals"] == 1:
            log.info(
                "signal %d: draining%s",
                signum,
                "; send again to exit at once" if repeat_exits else "",
            )
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _install_reload_signal(reload: Callable[[], object]) -> None:
    """SIGHUP calls ``reload`` (which sets a flag). A supervisor starts its workers with
    SIGHUP blocked, so that one forwarded before this handler exists waits, pending,
    instead of killing the worker: it is delivered here, once unblocked."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        reload()

    signal.signal(signal.SIGHUP, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


if __name__ == "__main__":
    raise SystemExit(main())

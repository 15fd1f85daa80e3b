"""The commands beside serving: ``check``, ``replay``, ``offsets``, ``features load`` and
``model inspect / optimize``, each a thin shell over ``worker.tools`` or ``worker.replay``
that prints and picks the exit code."""

from __future__ import annotations

import argparse
import logging
import sys

from worker.cli.signals import install_signal_handlers
from worker.errors import ConfigError, StreamferError

__all__ = [
    "cmd_check",
    "cmd_features_load",
    "cmd_model_inspect",
    "cmd_model_optimize",
    "cmd_offsets",
    "cmd_replay",
]


def cmd_model_inspect(args: argparse.Namespace) -> int:
    import orjson

    from worker.tools import inspect_model

    try:
        info = inspect_model(args.file)
    except StreamferError as exc:
        return _failed("streamfer model inspect", exc)
    print(orjson.dumps(info.as_dict()).decode() if args.json else info.text())
    return 0


def cmd_model_optimize(args: argparse.Namespace) -> int:
    import orjson

    from worker.tools import OptimizeOptions, optimize_model

    options = OptimizeOptions(
        mode=args.mode,
        calibration=args.calibration,
        eval_rows=args.eval,
        output=args.output,
        max_drop=args.max_drop,
        max_abs_diff=args.max_abs_diff,
        max_mean_abs_diff=args.max_mean_abs_diff,
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


def cmd_features_load(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.features import redis_client
    from worker.tools import load_features

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


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when every check passed, 1 when a Kafka check failed (each named on its
    line), 2 when the config, a model or the feature store cannot serve."""
    import orjson

    from worker.config import load_config, redacted
    from worker.tools import (
        CheckLine,
        check_kafka,
        check_pipeline,
        check_registry,
        check_sentinel,
    )

    lines: list[CheckLine] = []
    try:
        config = load_config(args.config)
        if args.print_config:
            print(orjson.dumps(redacted(config), option=orjson.OPT_INDENT_2).decode())
        for line in check_sentinel(config.redis):  # where the lookups below go
            lines.append(line)
            if not args.json:
                print(line.text(), flush=True)
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
        for line in check_registry(config):
            lines.append(line)
            if not args.json:
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


def cmd_replay(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.ops import setup_logging
    from worker.replay import ReplayOptions, run_replay
    from worker.tools import Bounds, parse_offset_bound, parse_partitions, parse_time

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
                "--state-dir, --current-model, --dry-run and --json with it"
            )
        if args.current_model and not args.resume:
            raise ConfigError("--current-model goes with --resume")
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
            current_model=args.current_model,
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
            on_start=lambda replay: install_signal_handlers(replay.stop),
            as_json=args.json,
        )
    except StreamferError as exc:
        return _failed("streamfer replay", exc)


def cmd_offsets(args: argparse.Namespace) -> int:
    from worker.config import load_config
    from worker.tools import (
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

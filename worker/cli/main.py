"""The ``streamfer`` parser: every command and its flags, each bound to its handler;
the commands of plug-ins (``worker.cli.plugins``) follow streamfer's own."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from worker.cli.commands import (
    cmd_check,
    cmd_features_load,
    cmd_model_inspect,
    cmd_model_optimize,
    cmd_offsets,
    cmd_replay,
)
from worker.cli.plugins import add_plugin_commands
from worker.cli.serve import cmd_run
from worker.core import __version__

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """streamfer's own commands; with the command line ``argv``, also those of plug-ins,
    unless ``argv`` names one of streamfer's own (so ``streamfer run`` imports none)."""
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
    run.set_defaults(func=cmd_run)

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
    check.set_defaults(func=cmd_check)

    _add_replay_commands(sub)
    _add_feature_commands(sub)
    _add_model_commands(sub)
    if argv is not None and _command(argv) not in sub.choices:
        add_plugin_commands(sub)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (streamfer's own
    options, ``--help`` and ``--version``, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


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
    replay.add_argument(
        "--model-version",
        help="version stamped on results and in the topic name; for a model on a Triton "
        "server, the version of it there to run (default: the one it serves)",
    )
    replay.add_argument(
        "--current-model",
        action="store_true",
        help="with --resume: go on with the model as it is now (another file hash, the "
        "version a Triton server serves now) instead of refusing it; results name it",
    )
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
    replay.set_defaults(func=cmd_replay)

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
    show.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: the group, its state, members, lag and partitions",
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-time", help="first record at or after: ISO-8601 or epoch ms")
    to.add_argument("--to-earliest", action="store_true", help="to each partition's log start")
    to.add_argument("--to-latest", action="store_true", help="to each partition's log end")
    reset.add_argument("--partitions", help="only these partitions, e.g. 0,2,5-7")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    offsets.set_defaults(func=cmd_offsets)


def _add_feature_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    features = sub.add_parser("features", help="manage the features a pipeline reads")
    fsub = features.add_subparsers(dest="features_command", required=True)
    load = fsub.add_parser("load", help="write features from CSV or Parquet into Redis")
    _config_argument(load)
    load.add_argument("--pipeline", help="pipeline whose lookups to use (default: the first)")
    load.add_argument("--lookup", help="the lookup to write (default: the pipeline's first)")
    load.add_argument("--file", required=True, type=Path, help=".csv, .tsv or .parquet")
    load.add_argument(
        "--entity-column", default="entity", help="the column holding entity ids (entity)"
    )
    load.add_argument(
        "--layout",
        choices=["hash", "packed"],
        default=None,
        help="default: the lookup's layout",
    )
    load.add_argument("--chunk", type=int, default=5000, help="rows per pipelined write")
    load.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    load.set_defaults(func=cmd_features_load)


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
    inspect.set_defaults(func=cmd_model_inspect)
    optimize = msub.add_parser(
        "optimize",
        help="an FP16 or INT8 copy, compared with the FP32 model on held-out rows",
        description="CSV rows: a header, then columns filling the model's inputs in its "
        "input order. A classifier is held to --max-drop, a model with no label (a "
        "regressor, one output column) to --max-abs-diff and --max-mean-abs-diff. Exit "
        "codes: 0 written, 1 refused (nothing written) or failed, 2 bad usage or input.",
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
        "--max-abs-diff",
        type=float,
        default=None,
        metavar="X",
        help="largest absolute difference of any output value from FP32's (0.01 for a "
        "model with no label, such as a regressor; a classifier's only when given)",
    )
    optimize.add_argument(
        "--max-mean-abs-diff",
        type=float,
        default=None,
        metavar="X",
        help="largest mean absolute difference of the outputs from FP32's (0.001 for a "
        "model with no label; a classifier's only when given)",
    )
    optimize.add_argument(
        "--speed-s", type=float, default=2.0, metavar="S", help="seconds of timing per model (2)"
    )
    optimize.add_argument("--json", action="store_true", help="print the report as JSON")
    optimize.set_defaults(func=cmd_model_optimize)

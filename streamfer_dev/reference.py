"""The documentation's reference pages, written from the code so they cannot drift from it.

Each function returns one Markdown page: every configuration field from the pydantic
schema, every command and flag from the argument parser, every metric family from a
fresh registry, every dead-letter code from the dead-letter schema. The docs build runs
them (``docs/hooks/reference.py``); ``missing_descriptions`` lists what has no text, and
a unit test fails on any.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from worker.cli import build_parser
from worker.compose import Metrics
from worker.config import WorkerConfig

__all__ = [
    "PAGES",
    "ConfigField",
    "cli_page",
    "config_fields",
    "config_page",
    "dead_letter_codes",
    "dead_letters_page",
    "metric_families",
    "metrics_page",
    "missing_descriptions",
]

ENV_PREFIX = "STREAMFER_"
_SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "dead-letter.schema.json"


@dataclass(frozen=True, slots=True)
class ConfigField:
    """One leaf or section of the configuration, as a user writes its path."""

    path: str
    type: str
    default: str
    allowed: str
    description: str
    env: str
    section: bool


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def _is_list_of_models(annotation: Any) -> bool:
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is list and _models_in(arg):
            return True
    return False


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "none"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "choice"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"table of {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    names = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "string (secret)", "Path": "path"}.get(name, names.get(name, name))


def _allowed(annotation: Any) -> str:
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is typing.Literal:
            return ", ".join(f"`{v}`" for v in typing.get_args(arg))
        if typing.get_origin(arg) is list:
            inner = _allowed(typing.get_args(arg)[0])
            if inner:
                return inner
    return ""


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return ""
    if isinstance(value, BaseModel):
        return ""
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | int | float):
        return f"`{json.dumps(value) if isinstance(value, str) else value}`"
    return f"`{json.dumps(value, default=str)}`"


def _constraints(field: Any) -> str:
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    return ", ".join(bounds)


def _walk(model: type[BaseModel], path: str, env: str) -> Iterator[ConfigField]:
    for name, field in model.model_fields.items():
        sub = f"{path}.{name}" if path else name
        sub_env = f"{env}__{name.upper()}" if env else f"{ENV_PREFIX}{name.upper()}"
        many = _is_list_of_models(field.annotation)
        models = _models_in(field.annotation)
        allowed = _allowed(field.annotation)
        bounds = _constraints(field)
        yield ConfigField(
            path=f"{sub}[]" if many else sub,
            type=_type_name(field.annotation),
            default=_default(field),
            allowed=", ".join(p for p in (allowed, bounds) if p),
            description=field.description or "",
            env=f"{sub_env}__0" if many else sub_env,
            section=bool(models),
        )
        for child in models:
            yield from _walk(
                child, f"{sub}[]" if many else sub, f"{sub_env}__0" if many else sub_env
            )


def config_fields() -> list[ConfigField]:
    """Every field of ``WorkerConfig``, depth first, sections before their fields."""
    return list(_walk(WorkerConfig, "", ""))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_page() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the configuration schema (`worker/config/`) when the documentation "
        "is built. One TOML file holds these fields; `streamfer check --config FILE` "
        "validates it, and a wrong field fails start-up with exit code 2 naming it.",
        "",
        "Every field can be overridden from the environment: `STREAMFER_` + the path in "
        "upper case with `__` between levels and list indices as numbers (the *Environment* "
        "column shows the first pipeline, index 0). Values are read as TOML values "
        "(numbers, booleans, arrays), anything else as a string; secrets, names and "
        "addresses are taken as written. `STREAMFER_CONFIG` names the config file for "
        "every command that takes `--config`.",
        "",
    ]
    for f in config_fields():
        if f.section:
            lines += [f"## `{f.path}`", "", _cell(f.description), ""]
            lines += [f"Environment prefix: `{f.env}__...`", ""]
            continue
        lines += [f"### `{f.path}`", "", _cell(f.description), ""]
        lines += [f"- Type: {f.type}"]
        if f.default:
            lines += [f"- Default: {f.default}"]
        if f.allowed:
            lines += [f"- Allowed: {f.allowed}"]
        lines += [f"- Environment: `{f.env}`", ""]
    return "\n".join(lines)


def _commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name, ""), sub
                yield from _commands(sub, f"{prefix} {name}")


def _flags(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        names = ", ".join(action.option_strings) or action.dest
        if action.option_strings and action.nargs != 0:
            names += f" {action.metavar or action.dest.upper()}"
        yield names, action.help or ""


def cli_commands() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Every command (plug-ins included) with its help and its flags and their help."""
    parser = build_parser([])
    found = [("streamfer", parser.description or "", list(_flags(parser)))]
    for name, help_text, sub in _commands(parser, "streamfer"):
        found.append((name, help_text, list(_flags(sub))))
    return found


def cli_page() -> str:
    lines = [
        "# Command-line reference",
        "",
        "Generated from the argument parser (`worker/cli/`) when the documentation is "
        "built; `streamfer COMMAND --help` prints the same. Exit codes: 0 clean stop, "
        "1 the worker failed, 2 bad configuration or usage (`replay`: 3 stopped by a "
        "signal).",
        "",
    ]
    for name, help_text, flags in cli_commands():
        lines += [f"## `{name}`", "", _cell(help_text), ""]
        if flags:
            lines += ["| flag | what it does |", "|---|---|"]
            lines += [f"| `{flag}` | {_cell(text)} |" for flag, text in flags]
            lines += [""]
    return "\n".join(lines)


def metric_families() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(name, type, documentation, label names) of every family a worker exports."""
    registry = CollectorRegistry()
    Metrics(registry)
    found = []
    for collector in list(registry._collector_to_names):
        for family in collector.collect():
            suffix = "_total" if family.type == "counter" else ""
            labels = tuple(getattr(collector, "_labelnames", ()))
            found.append((family.name + suffix, family.type, family.documentation, labels))
    return sorted(found)


def metrics_page() -> str:
    lines = [
        "# Metrics reference",
        "",
        "Generated when the documentation is built from the families each unit declares "
        "(`worker/<unit>/metrics.py`), which `worker.compose.Metrics` builds on one "
        "registry. Served on `/metrics` when `[metrics] port` is set; no "
        "label carries a record key or id. Under `streamfer run --processes N` every "
        "sample also carries `process`, and the supervisor adds "
        "`streamfer_supervisor_processes`, `streamfer_supervisor_restarts_total{process}` "
        "and `streamfer_supervisor_process_up{process}` (see "
        "[Scaling](../how-to/scaling.md)).",
        "",
        "| metric | type | labels | what it counts |",
        "|---|---|---|---|",
    ]
    for name, kind, doc, labels in metric_families():
        label_text = ", ".join(f"`{label}`" for label in labels)
        lines.append(f"| `{name}` | {kind} | {label_text} | {_cell(doc)} |")
    return "\n".join(lines) + "\n"


def dead_letter_codes() -> list[dict[str, Any]]:
    """Every dead-letter code the dead-letter schema lists, with its stages and meaning."""
    schema = json.loads(_SCHEMA.read_text())
    codes: list[dict[str, Any]] = schema["properties"]["code"]["oneOf"]
    return codes


def dead_letters_page() -> str:
    lines = [
        "# Dead-letter codes",
        "",
        "Generated from the dead-letter schema (`schemas/dead-letter.schema.json`) when the "
        "documentation is built. A dead letter carries `stage`, `code` and a readable "
        "`reason`, also as the headers `streamfer.error_stage`, `streamfer.error_code` and "
        "`streamfer.error_reason`; [Dead letters](../concepts/dead-letters.md) describes "
        "the rest of it.",
        "",
        "| code | stage | meaning |",
        "|---|---|---|",
    ]
    for code in dead_letter_codes():
        stages = ", ".join(code.get("x-stages", []))
        lines.append(f"| `{code['const']}` | {stages} | {_cell(code.get('description', ''))} |")
    return "\n".join(lines) + "\n"


PAGES = {
    "reference/configuration.md": config_page,
    "reference/cli.md": cli_page,
    "reference/metrics.md": metrics_page,
    "reference/dead-letters.md": dead_letters_page,
}
"""Generated page (relative to ``docs/``) -> the function that writes it."""


def missing_descriptions() -> list[str]:
    """Every field, command, flag, metric or dead-letter code without a description."""
    missing = [f"config field {f.path}" for f in config_fields() if not f.description.strip()]
    for name, help_text, flags in cli_commands():
        if not help_text.strip():
            missing.append(f"command {name}")
        missing += [f"flag {name} {flag}" for flag, text in flags if not text.strip()]
    missing += [f"metric {name}" for name, _, doc, _ in metric_families() if not doc.strip()]
    for code in dead_letter_codes():
        if not str(code.get("description", "")).strip() or not code.get("x-stages"):
            missing.append(f"dead-letter code {code.get('const')}")
    return missing

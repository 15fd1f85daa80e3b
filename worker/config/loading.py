"""Loading the configuration once: one TOML file, then environment overrides.

Variables ``STREAMFER_<SECTION>__<FIELD>`` override the file, with ``__`` between levels
and list indices as numbers (``STREAMFER_PIPELINES__0__BATCH__MAX_WAIT_MS=5``). A bad value
raises ``ConfigError`` naming the field; no message quotes a secret.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    ValidationError,
)

from worker.config.resolution import read_secret_files, resolve_and_check_models
from worker.config.worker_config import WorkerConfig
from worker.errors import ConfigError

__all__ = ["ENV_PREFIX", "load_config", "parse_config"]

ENV_PREFIX = "STREAMFER_"


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> WorkerConfig:
    """Read a TOML file, apply ``STREAMFER_`` overrides, validate. Raises ``ConfigError``."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_config(raw, environ=environ, base_dir=path.parent, source=str(path))


def parse_config(
    raw: dict[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
    source: str = "config",
) -> WorkerConfig:
    """Validate a config mapping; relative model paths resolve against ``base_dir``."""
    data = _apply_env(raw, os.environ if environ is None else environ)
    try:
        cfg = WorkerConfig.model_validate(data)
    except ValidationError as exc:
        # Raised outside this block, so that not even the suppressed context of the
        # ConfigError holds the ValidationError, whose text quotes the input values.
        problems = _describe(exc)
    else:
        problems = ""
    if problems:
        raise ConfigError(f"{source}: invalid configuration\n{problems}") from None
    base = base_dir or Path.cwd()
    cfg = read_secret_files(resolve_and_check_models(cfg, base, source), base, source)
    cfg.redis.checked_url(source)
    return cfg


# Secrets and names are taken as written: a password "1e3" must not become 1000.0.
_VERBATIM_FIELDS = frozenset(
    {
        "url",
        "password",
        "username",
        "sasl_password",
        "sentinel_password",
        "sentinel_username",
        "service_name",
        "sasl_username",
        "group_id",
        "group_instance_id",
        "bootstrap_servers",
        "name",
        "version",
    }
)


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = _deep_copy(raw)
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not parts or parts[0] not in WorkerConfig.model_fields:
            continue  # STREAMFER_CONFIG, STREAMFER_CACHE and the like are not overrides
        text = environ[name]
        value = text if parts[-1] in _VERBATIM_FIELDS else _parse_env_value(text)
        _set_path(data, parts, value, name)
    return data


def _set_path(data: dict[str, Any], parts: list[str], value: Any, env_name: str) -> None:
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{env_name}: no list item {part!r} to override")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise ConfigError(f"{env_name}: cannot descend into a {type(node).__name__}")


def _parse_env_value(text: str) -> Any:
    """Read a value as TOML (numbers, booleans, arrays); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ""
        for part in err["loc"]:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        lines.append(f"  {where or '<root>'}: {err['msg']}")
    return "\n".join(lines)

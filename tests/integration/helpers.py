"""Helpers shared by the integration tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

# Bad requests beyond the demo's mix: each must become a dead letter with this code.
EXTRA_BAD: dict[str, tuple[bytes, str]] = {
    "oversized": (b'{"id": "big", "entity": "' + b"x" * 70_000 + b'"}', "oversized"),
    "array": (b"[1, 2, 3]", "not_an_object"),
    "overflow": (b'{"id": "o", "features": {"f0": 1e400}}', "invalid_json"),
    "invalid_utf8": (b'{"id": "\xff\xfe"}', "invalid_json"),
    "unknown_feature": (
        b'{"id": "u", "entity": "it-1", "features": {"nope": 1}}',
        "unknown_feature",
    ),
    "string_feature": (b'{"id": "s", "entity": "it-1", "features": {"f1": "7"}}', "wrong_type"),
    "deep": (b"[" * 5000 + b"]" * 5000, "invalid_json"),
    "null_json": (b"null", "not_an_object"),
}


def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def assert_valid(v: Draft202012Validator, doc: Any) -> None:
    errors = sorted(v.iter_errors(doc), key=str)
    assert not errors, f"{errors[0].message} in {orjson.dumps(doc)[:300]!r}"


def assert_committed_to_end(bootstrap: str, group: str, topic: str) -> None:
    """Every partition's committed offset is its log end; an empty one may have none."""
    from streamfer_dev.harness import committed_offsets, end_offsets

    committed = committed_offsets(bootstrap, group, topic)
    ends = end_offsets(bootstrap, topic)
    normalised = {p: (ends[p] if off < 0 and ends[p] == 0 else off) for p, off in committed.items()}
    assert normalised == ends, f"committed {committed} != log end {ends}"


def wait_committed_to_end(bootstrap: str, group: str, topic: str, timeout: float = 60) -> None:
    """Until the running worker's commits reach every partition's log end (they follow
    the deliveries, asynchronously): ``assert_committed_to_end`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            assert_committed_to_end(bootstrap, group, topic)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def streamfer(
    *args: str,
    timeout: float = 120,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the ``streamfer`` command line as an operator would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        env=None if env is None else dict(env),
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without STREAMFER_ overrides, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFER_")}
    env.update(extra)
    return env


def write_config_with_redis(
    path: Path,
    *,
    bootstrap: str,
    topics: Any,
    model: Any,
    redis_url: str,
    redis_lines: str = "",
    **options: Any,
) -> Path:
    """A one-pipeline config for ``topics`` (a ``tests.conftest.Topics``) whose ``[redis]``
    table also holds ``redis_lines``; ``options`` go to ``worker_config_toml``."""
    from streamfer_dev.harness import worker_config_toml

    text = worker_config_toml(
        bootstrap=bootstrap,
        redis_url=redis_url,
        group=topics.group,
        request_topic=topics.requests,
        result_topic=topics.results,
        dead_letter_topic=topics.dead_letters,
        model_path=model.path,
        fields=model.fields,
        **options,
    )
    path.write_text(text.replace("[redis]\n", f"[redis]\n{redis_lines}\n", 1))
    return path


def scrape_metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample a worker's ``/metrics`` on ``port`` serves: (name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def http_get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET on the worker's metrics server (/readyz, say)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), bytes(resp.read()).decode()
    except urllib.error.HTTPError as exc:
        try:
            return int(exc.code), bytes(exc.read()).decode()
        finally:
            exc.close()


def eventually(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Whether ``check()`` turns true within ``timeout`` seconds (tried every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def services_toml(*, bootstrap: str, group: str, redis_url: str, metrics_port: int) -> str:
    """The ``[kafka]``, ``[redis]`` and ``[metrics]`` tables of a worker config serving
    several pipelines (their ``pipeline_toml`` tables follow)."""
    return f"""
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
session_timeout_ms = 10000

[redis]
url = "{redis_url}"

[metrics]
host = "127.0.0.1"
port = {metrics_port}
"""

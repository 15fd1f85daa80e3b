"""Examples that cannot rot: every TOML block of the documentation is a config the loader
takes, every Python block compiles, and the alert runbook covers exactly the alerts.

A TOML block that is deliberately a fragment (one section, say) follows a line
``<!-- partial -->``; it must still parse, and every key in it must be a field of the
schema where it stands.
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from worker.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[3]
PARTIAL = "<!-- partial -->"
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.M)


def pages() -> list[Path]:
    """Every page of the site, the files its pages include, and the README."""
    found = sorted((ROOT / "docs").rglob("*.md"))
    for page in list(found):
        found += [ROOT / name for name in INCLUDE.findall(page.read_text())]
    return [*found, ROOT / "README.md"]


def blocks(lang: str) -> list[tuple[str, str, bool]]:
    """(where, text, partial) of every fenced block in ``lang``."""
    found = []
    for page in pages():
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group("lang") != lang:
                continue
            before = text[: m.start()].rstrip().splitlines()
            partial = bool(before) and before[-1].strip() == PARTIAL
            indent = len(m.group("indent"))
            body = "\n".join(line[indent:] for line in m.group("body").splitlines())
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", body, partial))
    return found


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def unknown_keys(raw: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """Keys of ``raw`` that ``model`` has no field for, at any depth; a table may stand for
    one item of a list of tables (``[pipelines.cache]``)."""
    if isinstance(raw, list):
        return [k for item in raw for k in unknown_keys(item, model, where)]
    if not isinstance(raw, dict):
        return []
    problems = []
    for key, value in raw.items():
        field = model.model_fields.get(key)
        if field is None:
            problems.append(f"{where}{key}")
            continue
        for sub in _models(field.annotation):
            problems += unknown_keys(value, sub, f"{where}{key}.")
    return problems


TOML = blocks("toml")
PYTHON = blocks("python")


def test_the_docs_have_examples_to_check() -> None:
    assert len(TOML) > 10
    assert len(PYTHON) > 5
    assert any(not partial for _, _, partial in TOML)


@pytest.mark.parametrize(("where", "text", "partial"), TOML, ids=[w for w, _, _ in TOML])
def test_every_toml_example_is_a_config(where: str, text: str, partial: bool) -> None:
    raw = tomllib.loads(text)
    assert unknown_keys(raw, WorkerConfig) == [], where
    if not partial:
        WorkerConfig.model_validate(raw)


@pytest.mark.parametrize(("where", "text", "partial"), PYTHON, ids=[w for w, _, _ in PYTHON])
def test_every_python_example_compiles(where: str, text: str, partial: bool) -> None:
    compile(text, where, "exec")


def test_a_misspelt_key_in_a_partial_example_is_caught() -> None:
    raw = tomllib.loads("[pipelines.cache]\nenabled = true\nmax_entires = 10\n")
    assert unknown_keys(raw, WorkerConfig) == ["pipelines.cache.max_entires"]


def test_the_runbook_covers_every_alert_and_no_other() -> None:
    rules = (ROOT / "ops" / "prometheus" / "alerts.yml").read_text()
    alerts = set(re.findall(r"^\s*- alert: (\w+)\s*$", rules, re.M))
    runbook = (ROOT / "docs" / "operations" / "runbook.md").read_text()
    sections = set(re.findall(r"^## (\w+)\s*$", runbook, re.M))
    assert alerts
    assert sections == alerts

"""The generated reference pages: nothing without a description, and what they say holds."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from streamfer_dev import reference
from worker.config import parse_config

WORKER = Path(__file__).resolve().parents[3] / "worker"


def test_every_field_flag_metric_and_code_has_a_description() -> None:
    assert reference.missing_descriptions() == []


def test_a_config_field_without_a_description_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class Section(BaseModel):
        told: int = Field(default=1, description="says what it is")
        untold: int = 2

    class Config(BaseModel):
        section: Section = Field(default=Section(), description="a section")

    monkeypatch.setattr(reference, "WorkerConfig", Config)
    assert reference.missing_descriptions() == ["config field section.untold"]


def test_a_flag_without_help_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def parser(argv: object) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="streamfer", description="d")
        sub = p.add_subparsers()
        run = sub.add_parser("run", help="runs")
        run.add_argument("--fast", action="store_true")
        return p

    monkeypatch.setattr(reference, "build_parser", parser)
    assert "flag streamfer run --fast" in reference.missing_descriptions()


def test_a_code_without_a_stage_or_meaning_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    codes = [{"const": "odd", "x-stages": ["decode"]}, {"const": "fine", "description": "x"}]
    monkeypatch.setattr(reference, "dead_letter_codes", lambda: codes)
    missing = reference.missing_descriptions()
    assert "dead-letter code odd" in missing
    assert "dead-letter code fine" in missing


def _codes_the_worker_writes() -> set[str]:
    """Codes passed where the pipeline records a refusal: ``Rejection(i, stage, code, ..)``,
    ``_Problem(code, ..)``, ``_reject(spec, mask, x, out, code, ..)`` and the
    ``(code, reason)`` pairs of the feature stores."""
    positions = {"Rejection": 2, "_Problem": 0, "_reject": 4}
    found = set()
    for path in WORKER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                at = positions.get(name)
                if at is not None and len(node.args) > at:
                    arg = node.args[at]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found.add(arg.value)
            if isinstance(node, ast.Tuple) and len(node.elts) == 2:
                first = node.elts[0]
                if (
                    isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and first.value.endswith(("_error", "_value"))
                ):
                    found.add(first.value)
    return found


def test_the_catalogue_holds_every_code_the_worker_writes_and_no_other() -> None:
    catalogue = {code["const"] for code in reference.dead_letter_codes()}
    written = _codes_the_worker_writes()
    assert written, "the scan found no codes at all"
    assert written <= catalogue, f"not in schemas/dead-letter.schema.json: {written - catalogue}"
    literals = {
        node.value
        for path in WORKER.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert catalogue <= literals, f"codes no code writes: {catalogue - literals}"


def test_the_environment_names_the_page_gives_override_their_fields(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    fields = {f.path: f for f in reference.config_fields()}
    raw = {
        "pipelines": [
            {
                "name": "p",
                "request_topics": ["in"],
                "result_topic": "out",
                "dead_letter_topic": "dlq",
                "features": {"fields": ["a"]},
                "model": {"path": "m.onnx", "name": "m"},
            }
        ]
    }
    environ = {
        fields["pipelines[].batch.max_wait_ms"].env: "7",
        fields["kafka.group_id"].env: "g-1",
        fields["log_format"].env: "json",
    }
    config = parse_config(raw, environ=environ, base_dir=tmp_path)
    assert config.pipelines[0].batch.max_wait_ms == 7
    assert config.kafka.group_id == "g-1"
    assert config.log_format == "json"


def test_the_pages_carry_what_they_list() -> None:
    config = reference.config_page()
    assert "### `pipelines[].batch.max_batch_size`" in config
    assert "`STREAMFER_PIPELINES__0__BATCH__MAX_BATCH_SIZE`" in config
    assert "Allowed: `at-least-once`, `exactly-once`" in config
    metrics = reference.metrics_page()
    assert "| `streamfer_dead_letters_total` | counter | `pipeline`, `code` |" in metrics
    assert "## `streamfer replay`" in reference.cli_page()
    assert "| `redelivered` | consume |" in reference.dead_letters_page()

"""The earlier commit a benchmark runs beside today's worker (``--baseline-ref``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.contenders import ROOT, Job, launch
from benchmarks.run import _source_tree


def _job(tmp_path: Path, baseline_root: Path | None) -> Job:
    return Job(
        bootstrap="127.0.0.1:9",
        redis_url="redis://127.0.0.1:1",
        request_topic="req",
        result_topic="res",
        dead_letter_topic="dlq",
        group="g",
        model_path=tmp_path / "m.onnx",
        model_name="m",
        fields=["f0"],
        workdir=tmp_path,
        baseline_root=baseline_root,
    )


def test_a_commit_is_unpacked_as_it_was_committed(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    committed = subprocess.run(
        ["git", "show", f"{head}:worker/__main__.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    tree = _source_tree(head, tmp_path / "baseline")
    assert (tree / "worker" / "__main__.py").read_bytes() == committed
    assert not (tree / ".git").exists()


def test_an_unknown_ref_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--baseline-ref no-such-ref"):
        _source_tree("no-such-ref", tmp_path / "baseline")


def test_the_baseline_runs_its_own_worker_package_on_the_same_config(tmp_path: Path) -> None:
    """A stand-in tree whose ``worker`` prints where it was imported from and its
    arguments: the contender must import the tree's package, not this checkout's."""
    tree = tmp_path / "old"
    (tree / "worker").mkdir(parents=True)
    (tree / "worker" / "__init__.py").write_text("")
    (tree / "worker" / "__main__.py").write_text(
        "import sys, worker; print(worker.__file__, *sys.argv[1:])\n"
    )
    launched = launch("streamfer_baseline", _job(tmp_path, tree))
    (process,) = launched.processes
    assert process.wait(30) == 0
    (log,) = launched.logs
    imported, command, flag, config = log.read_text().split()
    assert imported == str(tree / "worker" / "__init__.py")
    assert (command, flag) == ("run", "--config")
    assert 'group_id = "g"' in Path(config).read_text()


def test_the_baseline_needs_a_tree(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--baseline-ref"):
        launch("streamfer_baseline", _job(tmp_path, None))

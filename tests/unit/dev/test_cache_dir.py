"""The tool cache exists once asked for: Triton's venv is made in a temporary folder
inside it, which failed on a fresh machine where nothing had made the folder yet."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from streamfer_dev.stack import cache_dir


def test_a_missing_cache_folder_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "fresh" / "home" / ".cache" / "streamfer"
    monkeypatch.setenv("STREAMFER_CACHE", str(where))

    assert cache_dir() == where
    assert where.is_dir()
    # what streamfer_dev.triton.server_python does first on a fresh machine
    assert Path(tempfile.mkdtemp(prefix="pytriton.", dir=cache_dir())).parent == where


def test_an_existing_cache_folder_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kafka-4.4.0").mkdir()
    monkeypatch.setenv("STREAMFER_CACHE", str(tmp_path))

    assert cache_dir() == tmp_path
    assert (tmp_path / "kafka-4.4.0").is_dir()

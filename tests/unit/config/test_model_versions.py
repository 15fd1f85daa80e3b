"""A directory of numbered model versions: the highest or the pinned one, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config.model_versions import MODEL_FILE, list_versions, resolve_version
from worker.errors import ConfigError


def _version(root: Path, name: str, *, file: bool = True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    if file:
        (folder / MODEL_FILE).write_bytes(b"onnx bytes of version " + name.encode())
    return folder


def test_the_highest_number_wins_not_the_last_name(tmp_path: Path) -> None:
    for name in ("2", "10", "9"):
        _version(tmp_path, name)
    chosen = resolve_version(tmp_path, None, field="model.path")
    assert (chosen.name, chosen.number) == ("10", 10)
    assert chosen.path == tmp_path / "10" / MODEL_FILE
    assert [v.name for v in list_versions(tmp_path)] == ["2", "9", "10"]


def test_entries_that_are_not_versions_are_ignored(tmp_path: Path) -> None:
    _version(tmp_path, "3")
    _version(tmp_path, "latest")  # a name, not a number
    _version(tmp_path, "4.tmp")  # being prepared
    _version(tmp_path, "v5")
    _version(tmp_path, "-6")
    _version(tmp_path, "\u0667")  # ARABIC-INDIC DIGIT SEVEN: a digit, not an ASCII one
    _version(tmp_path, "7", file=False)  # a version folder still without its file
    (tmp_path / "8").write_bytes(b"a file named like a version")
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "other.onnx").write_bytes(b"not called model.onnx")
    assert [v.name for v in list_versions(tmp_path)] == ["3"]
    assert resolve_version(tmp_path, None, field="f").name == "3"


def test_a_directory_without_versions_names_the_field_and_the_path(tmp_path: Path) -> None:
    _version(tmp_path, "latest")
    with pytest.raises(ConfigError) as err:
        resolve_version(tmp_path, None, field="pipelines[0].model.path")
    text = str(err.value)
    assert "pipelines[0].model.path" in text and str(tmp_path) in text and MODEL_FILE in text


def test_an_unreadable_directory_has_no_versions(tmp_path: Path) -> None:
    assert list_versions(tmp_path / "missing") == []


def test_a_pinned_version_is_served_even_below_the_highest(tmp_path: Path) -> None:
    for name in ("1", "2", "3"):
        _version(tmp_path, name)
    assert resolve_version(tmp_path, "2", field="f").path == tmp_path / "2" / MODEL_FILE
    # the number counts, not its spelling
    assert resolve_version(tmp_path, "02", field="f").name == "2"


def test_a_pinned_version_that_is_not_there_lists_those_that_are(tmp_path: Path) -> None:
    for name in ("1", "3"):
        _version(tmp_path, name)
    with pytest.raises(ConfigError) as err:
        resolve_version(tmp_path, "2", field="pipelines[0].model.version")
    text = str(err.value)
    assert "pipelines[0].model.version" in text and "no version 2" in text and "1, 3" in text


def test_a_pinned_version_must_be_a_number(tmp_path: Path) -> None:
    _version(tmp_path, "1")
    with pytest.raises(ConfigError, match=r"'1\.0' is not a version"):
        resolve_version(tmp_path, "1.0", field="f")


def test_two_spellings_of_one_number_keep_the_first(tmp_path: Path) -> None:
    _version(tmp_path, "3")
    _version(tmp_path, "03")
    assert [v.name for v in list_versions(tmp_path)] == ["03"]

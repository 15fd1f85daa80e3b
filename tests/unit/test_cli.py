"""The command line's arguments: ``STREAMFER_CONFIG`` stands in for ``--config`` in every
command that takes a config."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.cli import _parser

COMMANDS = [
    ["run"],
    ["check"],
    ["replay"],
    ["offsets", "show"],
    ["offsets", "reset", "--to-latest"],
    ["features", "load", "--file", "f.csv"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_streamfer_config_supplies_the_config(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMFER_CONFIG", "/etc/streamfer/worker.toml")
    args = _parser().parse_args(command)
    assert args.config == Path("/etc/streamfer/worker.toml")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_config_on_the_command_line_wins(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMFER_CONFIG", "/etc/streamfer/worker.toml")
    args = _parser().parse_args([*command, "--config", "here.toml"])
    assert args.config == Path("here.toml")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_without_either_the_command_names_what_is_missing(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STREAMFER_CONFIG", raising=False)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(command)
    assert exc.value.code == 2
    assert "--config" in capsys.readouterr().err

"""The command line's arguments: ``STREAMFER_CONFIG`` stands in for ``--config`` in every
command that takes a config."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.cli import main
from worker.cli.main import build_parser

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
    args = build_parser().parse_args(command)
    assert args.config == Path("/etc/streamfer/worker.toml")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_config_on_the_command_line_wins(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMFER_CONFIG", "/etc/streamfer/worker.toml")
    args = build_parser().parse_args([*command, "--config", "here.toml"])
    assert args.config == Path("here.toml")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_without_either_the_command_names_what_is_missing(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STREAMFER_CONFIG", raising=False)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(command)
    assert exc.value.code == 2
    assert "--config" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
def test_a_bad_process_count_exits_2_naming_the_flag(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STREAMFER_PROCESSES", raising=False)
    assert main(["run", "--config", "absent.toml", f"--processes={value}"]) == 2
    err = capsys.readouterr().err
    assert "--processes" in err and "'auto'" in err and repr(value) in err


def test_a_bad_process_count_from_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAMFER_PROCESSES", "many")
    assert main(["run", "--config", "absent.toml"]) == 2
    assert "STREAMFER_PROCESSES (the default of --processes)" in capsys.readouterr().err


def test_the_flag_wins_over_the_environment_and_help_names_both(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAMFER_PROCESSES", "many")
    # a valid flag overrides the bad default: the next complaint is the missing config
    assert main(["run", "--config", "absent.toml", "--processes", "2"]) == 2
    assert "config file not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert "[env: STREAMFER_PROCESSES]" in " ".join(capsys.readouterr().out.split())

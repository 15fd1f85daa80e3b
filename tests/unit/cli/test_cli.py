"""The command line's arguments: ``STREAMFER_CONFIG`` stands in for ``--config`` in every
command that takes a config; commands that plug-ins add through the entry-point group
``streamfer.commands`` run like streamfer's own, and load only when they may be needed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from worker.cli import main, plugins
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


@dataclass
class FakePoint:
    """An entry point of the ``streamfer.commands`` group that counts its loads."""

    name: str
    value: str
    target: Callable[..., None]
    loads: int = 0

    def load(self) -> Callable[..., None]:
        self.loads += 1
        return self.target


def add_hello(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hello = sub.add_parser("hello", help="say hello")
    hello.add_argument("--name", default="world")
    hello.set_defaults(func=say_hello)


def say_hello(args: argparse.Namespace) -> int:
    print(f"hello {args.name}")
    return 3


def use_points(monkeypatch: pytest.MonkeyPatch, *points: Any) -> None:
    """Make ``points`` the whole ``streamfer.commands`` group."""

    def entry_points(*, group: str) -> list[Any]:
        assert group == plugins.GROUP
        return list(points)

    monkeypatch.setattr(plugins, "entry_points", entry_points)


def test_a_plugin_command_runs_with_its_flags_and_is_listed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_points(monkeypatch, FakePoint("hello", "tests:add_hello", add_hello))
    assert main(["hello", "--name", "you"]) == 3
    assert capsys.readouterr().out == "hello you\n"
    listed = build_parser([]).format_help()
    assert "hello" in listed and "say hello" in listed


def test_streamfers_own_commands_load_no_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    point = FakePoint("hello", "tests:add_hello", add_hello)
    use_points(monkeypatch, point)
    for argv in (["run", "--config", "x.toml"], ["offsets", "show"], ["--help", "check"]):
        assert "hello" not in build_parser(argv).format_help()
    assert build_parser().parse_args(["run", "--config", "x.toml"]).command == "run"
    assert point.loads == 0
    build_parser(["--help"])
    build_parser(["nothing-of-ours"])
    assert point.loads == 2


def test_a_plugin_that_cannot_load_is_listed_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = EntryPoint("broken", "streamfer_no_such_module:add", plugins.GROUP)
    use_points(monkeypatch, missing, FakePoint("silent", "tests:nothing", lambda _sub: None))
    assert "broken" in build_parser([]).format_help()
    assert main(["broken", "--any", "flags", "-h"]) == 2
    err = capsys.readouterr().err
    assert "streamfer broken: the command cannot be loaded from streamfer_no_such_module:add" in err
    assert "ModuleNotFoundError" in err
    assert main(["silent"]) == 2
    assert "it added no command of that name" in capsys.readouterr().err


def test_a_plugin_cannot_take_a_name_streamfer_has(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    point = FakePoint("check", "tests:add_hello", add_hello)
    use_points(monkeypatch, point)
    build_parser(["bogus"])
    assert point.loads == 0
    assert "the command 'check' of tests:add_hello is left out" in capsys.readouterr().err

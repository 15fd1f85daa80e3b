"""Commands that other packages add to ``streamfer``, found through the entry-point group
``streamfer.commands``: how ``streamfer demo`` comes from the dev package without the
runtime naming it.

Each entry point is named after the command it adds and loads to a function that takes
the parser's subparsers and adds that command as the built-in ones are added:
``add_parser(name, ...)``, its flags, and ``set_defaults(func=handler)``, the handler
taking the parsed arguments and returning the exit code. A name streamfer already has
(its own commands, or an earlier plug-in's) is left out with a note on stderr.

Plug-ins are imported only when ``worker.cli.main`` may need one: for help, for their
own command, or for a command streamfer does not have; a worker started with
``streamfer run`` imports none. A plug-in that fails to load is still listed, and
running it says why and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import EntryPoint, entry_points

__all__ = ["GROUP", "add_plugin_commands"]

GROUP = "streamfer.commands"


def add_plugin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add every plug-in's command to ``sub``, in the order of their names."""
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        if point.name in sub.choices:
            print(
                f"streamfer: the command {point.name!r} of {point.value} is left out: "
                "streamfer already has a command of that name",
                file=sys.stderr,
            )
            continue
        try:
            point.load()(sub)
        except Exception as exc:  # a broken plug-in must not break the other commands
            _unloadable(sub, point, f"{type(exc).__name__}: {exc}")
            continue
        if point.name not in sub.choices:
            _unloadable(sub, point, "it added no command of that name")


def _unloadable(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], point: EntryPoint, why: str
) -> None:
    """List the command anyway; running it, with any arguments, says why it is missing."""
    parser = sub.choices.get(point.name)
    if parser is None:
        # no option prefix: whatever flags the command would have had are taken as
        # they come, so that running it reaches the message instead of a usage error
        parser = sub.add_parser(
            point.name, help="(cannot be loaded)", add_help=False, prefix_chars="\0"
        )
        parser.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)

    def report(_args: argparse.Namespace) -> int:
        print(
            f"streamfer {point.name}: the command cannot be loaded from {point.value}: {why}",
            file=sys.stderr,
        )
        return 2

    parser.set_defaults(func=report)

"""The ``streamfer`` command line: run a worker, check a config, replay a slice of
history, show or reset a group's offsets, inspect or optimize a model, and the commands
plug-ins add (``worker.cli.plugins``), such as the demo.

Signal handlers only set a flag: the first SIGTERM or SIGINT asks the worker to drain,
commit and leave the group; a second one exits at once (uncommitted records are then
consumed again by the group). SIGHUP asks it to look for a new model version now
(``worker.models.reloader``). ``run --processes N`` runs a supervisor of N workers
(``worker.ops.supervisor``), which forwards the first signal to them and SIGKILLs them on the
second, and forwards every SIGHUP; a worker it started drains on a signal and leaves
repeats to it.

Exit codes: 0 clean stop, 1 the worker failed, 2 bad configuration or usage.
"""

from __future__ import annotations

from worker.cli.main import build_parser, main

__all__ = ["build_parser", "main"]

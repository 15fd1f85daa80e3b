"""Copies of a harness run's folders, kept after its stack has removed them.

The fault harness works in a scratch folder it removes when its stack stops; a loop of
runs that is read afterwards (which run failed, what the workers and brokers logged)
keeps a copy of each run's folder as it ends, and the brokers' logs at the end.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["keep_runs"]


def keep_runs(work: Path, into: Path, *, broker_logs: bool = False) -> None:
    """Copy the run folders under ``work`` not yet copied into ``into`` (with
    ``broker_logs``, the Kafka nodes' logs too), for a reading after the stack is gone."""
    into.mkdir(parents=True, exist_ok=True)
    for run_dir in work.iterdir():
        fresh = not (into / run_dir.name).exists()
        if run_dir.is_dir() and run_dir.name not in {"kafka", "redis"} and fresh:
            shutil.copytree(run_dir, into / run_dir.name, ignore=shutil.ignore_patterns("*.onnx"))
    if broker_logs:
        for log in (work / "kafka").glob("**/*.log"):
            if "data" not in log.parts:
                target = into / "kafka" / log.relative_to(work / "kafka")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(log, target)

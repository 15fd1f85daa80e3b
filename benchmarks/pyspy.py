"""Sampling contender processes with py-spy while they drain, and reading the samples.

``Profiler`` attaches ``py-spy record --format raw --nonblocking`` to each PID (when the
``py-spy`` binary is on PATH; ``pip install py-spy``), typically once the first results
arrive so start-up is not sampled, and stops it with SIGINT, which makes py-spy write the
collapsed stacks. ``top_frames`` reads such a file and returns the frames with the most
samples, by self time (the innermost frame) and inclusive time (anywhere on the stack).
py-spy leaves out threads it sees idle, but not all of them: a thread waiting in
``Condition.wait``, or in librdkafka's ``consume`` or ``poll`` with the GIL released, is
counted as busy there (seen in the worker's stage and loop threads), so those frames are
waits, not CPU. ``py-spy record --gil`` samples only the thread holding the GIL, which is
where Python time went.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Profiler", "top_frames"]

_LINE = re.compile(r":\d+\)$")


@dataclass
class Profiler:
    """py-spy recorders for a set of processes, writing ``<directory>/<label>-<pid>.txt``."""

    directory: Path
    rate: int = 200
    recorders: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    @staticmethod
    def available() -> bool:
        return shutil.which("py-spy") is not None

    def attach(self, label: str, pids: list[int]) -> None:
        binary = shutil.which("py-spy")
        if binary is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for pid in pids:
            out = self.directory / f"{label}-{pid}.txt"
            proc = subprocess.Popen(
                [
                    *(binary, "record", "--pid", str(pid), "--format", "raw"),
                    *("--rate", str(self.rate), "--nonblocking", "--output", str(out)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            )
            self.recorders.append((proc, out))

    def stop(self) -> list[Path]:
        """Stop every recorder (SIGINT, by PID); the files that were written."""
        written = []
        for proc, out in self.recorders:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
            if out.exists():
                written.append(out)
        self.recorders.clear()
        return written


def top_frames(path: Path, n: int = 15) -> dict[str, list[tuple[str, float]]]:
    """The ``n`` frames with the largest share of samples, by self and inclusive time."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_LINE.sub(")", f.strip()) for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return {"self": [], "inclusive": []}
    return {
        "self": [(f, round(100.0 * c / total, 1)) for f, c in own.most_common(n)],
        "inclusive": [(f, round(100.0 * c / total, 1)) for f, c in inclusive.most_common(n)],
    }

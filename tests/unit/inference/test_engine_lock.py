"""The TensorRT engine cache lock between real processes: while one holds it (building an
engine), another waits, and gets it as soon as the first lets go or dies."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.inference.engine_lock import LOCK_FILE, engine_cache_lock

ROOT = Path(__file__).resolve().parents[3]

# Takes the lock, says so (on stdout and in the journal), holds it until a line arrives on
# stdin (or stdin closes), and notes in the journal when it lets go.
HOLDER = """
import logging, sys
from pathlib import Path
from worker.inference.engine_lock import engine_cache_lock
folder, journal, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
logging.basicConfig(level=logging.INFO, format="%(message)s")
with engine_cache_lock(folder):
    with journal.open("a") as out:
        out.write(f"{name} held\\n")
    print("held", flush=True)
    sys.stdin.readline()
    with journal.open("a") as out:
        out.write(f"{name} lets go\\n")
"""


def start(folder: Path, name: str = "a") -> subprocess.Popen[str]:
    journal = folder.parent / "journal"
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), str(journal), name],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def held(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    assert process.stdout.readline() == "held\n", process.stderr and process.stderr.read()


def _until_waiting(process: subprocess.Popen[str]) -> str:
    """What ``process`` logged up to saying it waits for the lock (or exiting)."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if "another process holds the TensorRT engine cache" in line:
            break
    return "".join(lines)


@pytest.mark.timeout(60)
def test_a_second_process_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    folder = tmp_path / "engines"
    with start(folder, "first") as first:
        held(first)
        with start(folder, "second") as second:
            assert first.stdin is not None and second.stdin is not None
            second.stdin.write("\n")  # once it has the lock it lets go at once
            second.stdin.flush()
            waiting = _until_waiting(second)  # however long its start takes on a busy host
            assert second.poll() is None, "the second process ran while the first held"
            first.stdin.write("\n")
            first.stdin.flush()
            assert first.wait(timeout=30) == 0
            out, rest = second.communicate(timeout=30)
            err = waiting + rest
    assert out == "held\n", err
    assert f"another process holds the TensorRT engine cache {folder}" in err
    assert f"TensorRT engine cache {folder} free after" in err
    journal = (tmp_path / "journal").read_text().splitlines()
    assert journal == ["first held", "first lets go", "second held", "second lets go"]
    assert (folder / LOCK_FILE).read_bytes() == b""


@pytest.mark.timeout(60)
def test_the_lock_is_free_when_its_holder_dies(tmp_path: Path) -> None:
    with start(tmp_path / "engines") as holder:  # closes its pipes on the way out
        held(holder)
        holder.kill()  # no release: the kernel drops the lock with the process
        holder.wait()
    started = time.perf_counter()
    with engine_cache_lock(tmp_path / "engines"):
        pass
    assert time.perf_counter() - started < 5

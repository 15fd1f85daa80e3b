"""A disk of its own for a broker's log directory, which a fault may fill.

A broker whose disk is full fails every write to its log directory; with that directory
its only one, it stops. To do that to one broker of the local cluster without touching
the machine's real disk, each node's log directory is a small ``tmpfs`` (memory, capped
at ``size_mb``, nothing written elsewhere), and filling it is one file that takes every
byte left. Mounting needs root (``mount``/``umount``); ``unmount`` is called on every
way out of the stack, a busy mount is detached lazily.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from worker.errors import StackError

__all__ = ["FILLER", "fill", "free", "mount", "unmount"]

FILLER = "disk-full.filler"
"""The file that takes a filled disk's last byte; ``free`` removes it."""

_CHUNK = 1 << 20


def mount(path: Path, size_mb: int) -> None:
    """Mount a ``tmpfs`` of ``size_mb`` on ``path`` (created, and empty)."""
    if shutil.which("mount") is None:
        raise StackError("a disk of its own needs the mount command")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise StackError(f"cannot mount a tmpfs on {path} (root needed): {done.stderr.strip()}")


def unmount(path: Path) -> None:
    """Unmount ``path``; lazily (detached now, gone once nothing holds it) if busy."""
    for argv in (["umount", str(path)], ["umount", "-l", str(path)]):
        if subprocess.run(argv, capture_output=True, check=False).returncode == 0:
            return


def fill(path: Path) -> int:
    """Take every byte left on ``path``'s file system with one file; returns how many.
    ``tmpfs`` only: the machine's real disk is never filled."""
    if not _is_tmpfs(path):
        raise StackError(f"{path} is not a tmpfs of its own; refusing to fill it")
    st = os.statvfs(path)
    fd = os.open(path / FILLER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        taken = 0
        with contextlib.suppress(OSError):
            os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
            taken = st.f_bavail * st.f_frsize
        os.lseek(fd, taken, os.SEEK_SET)
        for size in (_CHUNK, 4096, 1):  # what rounding left, to the last byte
            with contextlib.suppress(OSError):
                while written := os.write(fd, b"\0" * size):
                    taken += written
    finally:
        os.close(fd)
    return taken


def free(path: Path) -> None:
    """Remove the filler: the disk has room again."""
    (path / FILLER).unlink(missing_ok=True)


def _is_tmpfs(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target and line.split()[2] == "tmpfs" for line in mounts)

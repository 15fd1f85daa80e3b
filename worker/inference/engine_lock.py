"""One process at a time in a TensorRT engine cache: an exclusive lock on a file in it.

ONNX Runtime's TensorRT provider looks for a cached engine when a session opens and, when
there is none, builds it and writes the file in place. Workers that share one
``engine_cache_dir`` (several processes on a host, pods on one volume) would each build the
same engine at once, and one could read a file another is still writing. ``engine_cache_lock``
holds ``fcntl.flock`` on ``.streamfer-engine.lock`` in that folder while a session opens:
the first process builds and writes, the others wait and then load the finished engine.
The kernel drops the lock when its holder exits, however it exits. Linux and macOS only
(``fcntl``); the lock file is empty and stays.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOCK_FILE", "engine_cache_lock"]

log = logging.getLogger(__name__)

LOCK_FILE = ".streamfer-engine.lock"


@contextmanager
def engine_cache_lock(folder: Path) -> Iterator[None]:
    """Hold the exclusive lock of the engine cache ``folder`` (created when missing) for the
    ``with`` block. Blocks, with one log line, while another process holds it: that one is
    building an engine, which may take minutes. Raises OSError when the folder or its lock
    file cannot be created."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / LOCK_FILE).open("a") as handle:  # "a": create, never truncate
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info(
                "another process holds the TensorRT engine cache %s (building an engine); "
                "waiting for it",
                folder,
            )
            started = time.perf_counter()
            fcntl.flock(handle, fcntl.LOCK_EX)
            log.info(
                "TensorRT engine cache %s free after %.1f s", folder, time.perf_counter() - started
            )
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

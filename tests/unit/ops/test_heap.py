"""The worker process's garbage collector, set once its start-up is done."""

from __future__ import annotations

import subprocess
import sys


def test_settle_heap_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    """In a process of its own: freezing is for a worker's whole life, not a test run's."""
    code = (
        "import gc\n"
        "from worker.ops import settle_heap\n"
        "from worker.ops.heap import YOUNG_THRESHOLD\n"
        "default = gc.get_threshold()\n"
        "settle_heap()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "assert gc.get_threshold() == (YOUNG_THRESHOLD, *default[1:]), gc.get_threshold()\n"
        "assert gc.isenabled()\n"
        "class Node:\n"
        "    pass\n"
        "a = Node(); a.me = a\n"
        "import weakref\n"
        "ref = weakref.ref(a)\n"
        "del a\n"
        "gc.collect()\n"
        "assert ref() is None  # cycles made after start-up are still collected\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

"""Several calls to a server in flight at once, at most a given number.

A batch larger than a remote model's ``max_batch_size`` goes as several calls; sent one
after another, each waits out the network and the server's queue while the server's
other instances sit idle. ``in_flight`` sends them through a callback API (tritonclient's
``async_infer``) so that up to ``bound`` are outstanding together, a new one going out as
each answers, and waits for all of them. After a failed call no further one is sent (the
batch fails as a whole, and its caller decides what that means); those already out are
waited for, so none is left running when it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from worker.errors import InferenceServerError

__all__ = ["Answered", "Send", "in_flight"]

Answered = Callable[[Any, Exception | None], None]
"""Called once per call, on any thread: (the answer, None) or (None, the error)."""

Send = Callable[[int, Answered], None]
"""Sends call ``i`` without waiting for it; its answer goes to the ``Answered`` given."""


def in_flight(send: Send, count: int, bound: int, wait_s: float) -> list[Any]:
    """Calls ``0 .. count - 1`` through ``send``, at most ``bound`` outstanding; returns
    each one's answer, or its error (an ``Exception``), or None for one never sent after
    another failed. ``wait_s``: longest wait for any one answer (the calls carry their own
    timeout; this guards against a client that never calls back), past it an
    ``InferenceServerError``. Blocks until every call sent has answered."""
    answers: list[Any] = [None] * count
    room = threading.Semaphore(max(1, bound))
    finished = threading.Semaphore(0)
    failed = threading.Event()
    sent = 0

    def answered_as(i: int) -> Answered:
        def answered(result: Any, error: Exception | None) -> None:
            answers[i] = result if error is None else error
            if error is not None:
                failed.set()
            room.release()
            finished.release()

        return answered

    for i in range(count):
        if not room.acquire(timeout=wait_s):
            failed.set()
            break
        if failed.is_set():
            room.release()
            break
        sent += 1
        try:
            send(i, answered_as(i))
        except Exception as exc:  # not sent at all: as a call that failed at once
            answered_as(i)(None, exc)
    for _ in range(sent):
        if not finished.acquire(timeout=wait_s):
            raise InferenceServerError(f"no answer to a call within {wait_s:.0f} s")
    return answers

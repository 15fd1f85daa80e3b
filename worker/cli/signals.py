"""Signal handlers that only set a flag: the first SIGTERM or SIGINT asks for a drain, a
second exits at once; SIGHUP asks for a model reload."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from types import FrameType

__all__ = ["install_reload_signal", "install_signal_handlers"]

log = logging.getLogger("streamfer")


def install_signal_handlers(stop: object, *, repeat_exits: bool = True) -> None:
    """SIGTERM and SIGINT call ``stop``; with ``repeat_exits`` a second one exits at once,
    without it every one calls ``stop`` (a supervisor counts them; a worker it started
    leaves the hard stop to it, which a process manager signalling the whole group twice
    must not trigger)."""
    assert callable(stop)
    state = {"signals": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        state["signals"] += 1
        if state["signals"] > 1 and repeat_exits:
            os._exit(128 + signum)
        if state["signals"] == 1:
            log.info(
                "signal %d: draining%s",
                signum,
                "; send again to exit at once" if repeat_exits else "",
            )
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def install_reload_signal(reload: Callable[[], object]) -> None:
    """SIGHUP calls ``reload`` (which sets a flag). A supervisor starts its workers with
    SIGHUP blocked, so that one forwarded before this handler exists waits, pending,
    instead of killing the worker: it is delivered here, once unblocked."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        reload()

    signal.signal(signal.SIGHUP, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})

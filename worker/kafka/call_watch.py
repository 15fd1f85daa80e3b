"""Blocking librdkafka calls the loop thread can see outlive their timeout.

librdkafka's transactional calls take a timeout, but it does not always hold: when the
group coordinator goes away, ``send_offsets_to_transaction`` can wait for good
(confluentinc/librdkafka issues 5456 and 5511), and with it every partition of the
worker. ``CallWatch.run`` makes such a call on a helper thread of its own while the
caller waits for it, so the caller keeps the deadline: once the call is past its own
timeout and a moment's grace (a call that returns at its own deadline kept it),
``on_stall`` is told (``/healthz`` turns unhealthy); once it is past its timeout plus a
margin, ``CallStalled`` is raised. The call itself cannot be cancelled, so the client it
belongs to is beyond use: the worker starts again in place without closing it
(``worker.ops.recovery``), and its new producer fences the stuck one.

The caller waits while the helper runs, never two calls at once: to librdkafka the call
is driven from one thread at a time, as before, and the loop thread is not sitting in
``consume`` meanwhile (the transaction API stalls when it is).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from worker.core import Clock, monotonic_clock
from worker.errors import CallStalled

__all__ = [
    "CALL_TIMEOUT_S",
    "COORDINATOR_CALL_TIMEOUT_S",
    "ON_TIME_GRACE_S",
    "STALL_MARGIN_S",
    "CallStalled",
    "CallWatch",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0
"""The timeout given to a transactional call that names none."""

COORDINATOR_CALL_TIMEOUT_S = 12.0
"""The timeout of a call that waits on the group coordinator
(``send_offsets_to_transaction``). librdkafka never times such a request out
(confluentinc/librdkafka issue 5456): it answers once the coordinator is found, or waits
for good on a coordinator it cached whose broker has left the cluster (issue 5511). A
coordinator that moved is found again about ``broker.session.timeout.ms`` (9 s by
default) after its broker died, plus the group's load; a call still unanswered
``STALL_MARGIN_S`` after this is not coming back, and waiting the general 30 s first
only kept the worker's partitions unserved longer."""

STALL_MARGIN_S = 10.0
"""How long past its own timeout a call may take before the worker gives it up: enough
for a slow broker's late answer, short against the minutes a wedged call waits."""

ON_TIME_GRACE_S = 1.0
"""A call that returns this soon after its own timeout kept it (librdkafka answers
_TIMED_OUT at its deadline, and the hand-over between threads takes a moment): it is no
stall. At most half the margin, so a short margin still leaves room to report one."""


class _Call(Generic[T]):
    """One call handed to the helper thread, and its outcome."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed back to the caller
            self.error = exc
        self.done.set()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # set by fn, which returned T


class CallWatch:
    """Runs blocking calls one at a time on a daemon thread, with a deadline the caller
    keeps. Not for concurrent callers: one thread (the loop) makes the calls."""

    def __init__(
        self,
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        coordinator_timeout_s: float = COORDINATOR_CALL_TIMEOUT_S,
        margin_s: float = STALL_MARGIN_S,
        on_stall: Callable[[str | None], None] | None = None,
        name: str = "streamfer-txn",
        clock: Clock = monotonic_clock,
    ) -> None:
        """``timeout_s`` is what each call is given unless it names its own,
        ``coordinator_timeout_s`` what a call waiting on the group coordinator names;
        ``on_stall(why)`` is told when a call passes its timeout and ``on_stall(None)``
        when a late call came back after all."""
        self.timeout_s = timeout_s
        self.coordinator_timeout_s = coordinator_timeout_s
        self._margin_s = margin_s
        self._on_stall = on_stall
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._next: _Call[Any] | None = None
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self.stalled: str | None = None
        """The call that outlived its deadline; no call runs after it."""

    def run(self, what: str, fn: Callable[[float], T], timeout_s: float | None = None) -> T:
        """``fn(timeout)`` (the call named ``what``, given ``timeout_s`` or the watch's
        timeout, which it promises to keep), or what it raised. Raises ``CallStalled``
        when it has not returned ``margin_s`` after that timeout, and for every call
        after such a one."""
        if self.stalled is not None:
            raise CallStalled(f"{what} not attempted: {self.stalled}")
        if timeout_s is None:
            timeout_s = self.timeout_s
        given = timeout_s
        call = _Call(lambda: fn(given))
        self._hand_over(call)
        started = self._clock()
        grace = min(ON_TIME_GRACE_S, self._margin_s / 2)
        if not call.done.wait(timeout_s + grace):
            why = f"{what} has not returned within its {timeout_s:g}s timeout"
            log.warning("%s; giving it %gs more", why, self._margin_s)
            self._tell(why)
            if not call.done.wait(self._margin_s - grace):
                waited = self._clock() - started
                self.stalled = (
                    f"{what} stalled: no answer {waited:.0f}s after it was called, although "
                    f"its timeout was {timeout_s:g}s (librdkafka can wait for good when the "
                    "group coordinator goes away)"
                )
                self._tell(self.stalled)
                raise CallStalled(self.stalled)
            self._tell(None)
        return call.outcome()

    def _tell(self, why: str | None) -> None:
        if self._on_stall is not None:
            self._on_stall(why)

    def _hand_over(self, call: _Call[T]) -> None:
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._next = call
            self._wake.notify()

    def _serve(self) -> None:
        while True:
            with self._wake:
                while self._next is None:
                    self._wake.wait()
                call, self._next = self._next, None
            call.run()

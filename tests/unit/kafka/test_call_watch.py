"""CallWatch: a blocking call that outlives its timeout is seen by the caller."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.errors import CallStalled
from worker.kafka.call_watch import CallWatch


def test_a_call_returns_its_value_and_gets_its_timeout() -> None:
    watch = CallWatch(timeout_s=7.0)
    assert watch.run("double", lambda t: t * 2) == 14.0
    assert watch.run("given", lambda t: t, timeout_s=3.0) == 3.0


def test_what_a_call_raises_reaches_the_caller() -> None:
    watch = CallWatch(timeout_s=1.0)

    def refuse(_t: float) -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced"))

    with pytest.raises(KafkaException, match="fenced"):
        watch.run("commit_transaction", refuse)
    assert watch.run("next", lambda _t: "ok") == "ok"  # an error is no stall


def test_a_late_call_is_reported_then_cleared() -> None:
    told: list[str | None] = []
    watch = CallWatch(timeout_s=0.05, margin_s=1.0, on_stall=told.append)
    # past its timeout and the grace (half the margin), inside the margin
    assert watch.run("slow", lambda _t: time.sleep(0.8) or "late") == "late"
    assert told[0] is not None and "slow has not returned within its 0.05s timeout" in told[0]
    assert told[-1] is None
    assert watch.stalled is None


def test_a_call_that_returns_at_its_own_deadline_is_no_stall() -> None:
    """librdkafka answers _TIMED_OUT right at the timeout it was given: that call kept
    it, so neither the log nor ``/healthz`` may call it stalled."""
    told: list[str | None] = []
    watch = CallWatch(timeout_s=0.2, margin_s=1.0, on_stall=told.append)

    def honours_timeout(timeout: float) -> str:
        time.sleep(timeout)
        return "timed out, retriable"

    for _ in range(10):
        assert watch.run("commit_transaction", honours_timeout) == "timed out, retriable"
    assert told == []
    assert watch.stalled is None


def test_a_stuck_call_raises_after_its_timeout_and_margin_and_refuses_the_next() -> None:
    told: list[str | None] = []
    release = threading.Event()
    watch = CallWatch(timeout_s=0.1, margin_s=0.2, on_stall=told.append)
    started = time.monotonic()
    with pytest.raises(CallStalled, match="send_offsets_to_transaction stalled") as raised:
        watch.run("send_offsets_to_transaction", lambda _t: release.wait(30))
    waited = time.monotonic() - started
    assert 0.3 <= waited < 2.0
    assert "its timeout was 0.1s" in str(raised.value)
    assert told and told[-1] == watch.stalled  # /healthz keeps the reason
    with pytest.raises(CallStalled, match="abort_transaction not attempted"):
        watch.run("abort_transaction", lambda _t: None)
    release.set()


def test_the_helper_thread_is_a_daemon_so_a_stuck_call_never_holds_the_exit() -> None:
    release = threading.Event()
    watch = CallWatch(timeout_s=0.01, margin_s=0.01)
    with pytest.raises(CallStalled):
        watch.run("stuck", lambda _t: release.wait(30))
    helpers = [t for t in threading.enumerate() if t.name == "streamfer-txn"]
    assert helpers and all(t.daemon for t in helpers)
    release.set()

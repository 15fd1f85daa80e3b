"""A worker whose Kafka client is stuck in a call: started again in place, or, when a
signal asked it to stop, an exit 0 that leaves the stuck clients unclosed."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes.clock import FakeClock
from worker.cli.serve import _recover
from worker.errors import CallStalled
from worker.ops import Recoveries

STALL = CallStalled("send_offsets_to_transaction stalled: no answer 22s after it was called")


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _exit_now(code: int) -> None:
    raise _Exited(code)


def _recoveries(execs: list[list[str]], fail: bool = False) -> Recoveries:
    clock = FakeClock()

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        execs.append(argv)
        if fail:
            raise OSError("no such file")

    return Recoveries(
        {}, CollectorRegistry(), clock=clock, sleep=clock.sleep, execve=execve, argv=["w"]
    )


def test_a_stall_met_while_stopping_exits_0_without_a_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    execs: list[list[str]] = []
    with caplog.at_level(logging.INFO), pytest.raises(_Exited) as exited:
        _recover("worker stopped", STALL, _recoveries(execs), lambda: True, _exit_now)
    assert exited.value.code == 0
    assert execs == []
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "stopped as asked" in caplog.text and "send_offsets_to_transaction" in caplog.text
    assert "recovering" not in caplog.text


def test_a_stall_while_serving_starts_the_worker_again_in_place() -> None:
    execs: list[list[str]] = []
    served = _recoveries(execs)
    with pytest.raises(_Exited) as exited:  # the fake execve returns: the image stays
        _recover("worker stopped", STALL, served, lambda: False, _exit_now)
    assert execs == [["w"]]
    assert exited.value.code == 1


def test_a_new_image_that_cannot_start_exits_1_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    execs: list[list[str]] = []
    with caplog.at_level(logging.INFO), pytest.raises(_Exited) as exited:
        _recover("worker stopped", STALL, _recoveries(execs, fail=True), lambda: False, _exit_now)
    assert exited.value.code == 1
    assert "exiting without closing the Kafka clients" in caplog.text


def test_a_fenced_producer_met_while_stopping_exits_0_and_otherwise_1() -> None:
    from worker.cli.serve import _stopped
    from worker.errors import ProducerUnusable

    fenced = ProducerUnusable("cannot abort the transaction (_FENCED)")
    assert _stopped(fenced, lambda: True) == 0
    assert _stopped(fenced, lambda: False) == 1

"""``ServerOutage``: a batch held for its inference server is tried again with backoff,
at once on another model, and given up when the worker stops (the pipeline-level
behaviour, two pipelines with one held, is in ``test_model_fault_isolation``); and
``when_served``: start-up waits for a server that cannot answer yet."""

from __future__ import annotations

import threading

import pytest

from tests.fakes.clock import FakeClock
from worker.errors import EngineError, InferenceServerError
from worker.inference import ModelIdentity
from worker.models import when_served
from worker.pipeline.server_outage import ServerOutage

DOWN = "inference server m:1 at 10.0.0.1:8001: UNAVAILABLE: failed to connect to all addresses"


def test_the_held_batch_is_tried_with_backoff_at_once_on_another_model() -> None:
    clock, heard = FakeClock(1000.0), []
    model = [ModelIdentity("m", "1", "a")]
    abort = threading.Event()
    outage = ServerOutage(
        "p",
        abort=abort,
        on_inference_server=lambda ok, why: heard.append((ok, why)),
        model=lambda: model[0],
        clock=clock,
    )
    first, longest = ServerOutage.RETRY_S
    parked = outage.held(InferenceServerError(DOWN), model[0])
    assert parked.after_s == pytest.approx(first) and heard == [(False, DOWN)]
    assert outage.holding and not outage.try_now()
    clock.now += first
    assert outage.try_now()
    waits = [outage.held(InferenceServerError(DOWN), model[0]).after_s for _ in range(12)]
    assert waits[0] == pytest.approx(2 * first) and waits[-1] == pytest.approx(longest)
    assert heard == [(False, DOWN)]  # an unchanged reason is heard once
    model[0] = ModelIdentity("m", "2", "b")
    assert outage.try_now()  # a version the reloader found is tried at once
    outage.released()
    assert not outage.holding and heard[-1] == (True, None)
    outage.held(InferenceServerError(DOWN), model[0])
    abort.set()
    with pytest.raises(InferenceServerError, match="UNAVAILABLE"):
        outage.try_now()  # a stopping worker ends the hold; the batch is not committed
    assert not outage.holding


def test_start_up_waits_for_the_server_and_says_so() -> None:
    heard: list[tuple[bool, str | None]] = []
    slept: list[float] = []
    answers: list[Exception | str] = [InferenceServerError(DOWN)] * 7 + ["loaded"]

    def load() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    loaded = when_served(
        load,
        pipeline="p",
        on_inference_server=lambda ok, why: heard.append((ok, why)),
        sleep=slept.append,
    )
    assert loaded == "loaded"
    assert slept == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert heard == [(False, DOWN), (True, None)]  # readiness names the server meanwhile


def test_start_up_ends_at_once_on_anything_but_an_outage() -> None:
    def load() -> str:
        raise EngineError("model m: output 'score' cannot be published")

    with pytest.raises(EngineError):
        when_served(load, pipeline="p", on_inference_server=lambda _ok, _why: None, sleep=[].append)

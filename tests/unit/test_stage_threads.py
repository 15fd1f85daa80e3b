"""The staged threads: order, overlap, bounded look-ahead, errors, rewind, close."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from worker.batch import Job
from worker.sink import DeliveryTracker
from worker.stage_threads import StageThreads, Step


def job(n: int, partition: int = 0) -> Job:
    return Job(f"p{n}", [], DeliveryTracker(f"p{n}"), {("t", partition): n + 1})


class Recorder:
    """Three stages like the worker's (prepare, infer, publish) that log what they do; a
    gate per job holds its publish stage."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        self.fail_prepare: str | None = None

    def log(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def prepare(self, job: Job) -> Step:
        self.log(f"prepare {job.pipeline}")
        if job.pipeline == self.fail_prepare:
            raise RuntimeError(f"prepare of {job.pipeline} failed")

        def infer() -> Step:
            self.log(f"infer {job.pipeline}")
            return publish

        def publish() -> None:
            self.log(f"publish {job.pipeline}")
            assert self.gate(job.pipeline).wait(10)
            job.tracker.seal()
            self.log(f"published {job.pipeline}")

        return infer


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def threads(recorder: Recorder) -> Iterator[StageThreads]:
    proc = StageThreads(recorder.prepare, stages=3, ahead=1)
    yield proc
    for gate in recorder.gates.values():
        gate.set()
    proc.close(5.0)


def test_jobs_publish_in_submission_order(recorder: Recorder, threads: StageThreads) -> None:
    jobs = [job(n) for n in range(6)]
    for j in jobs:
        recorder.gate(j.pipeline).set()
        threads.submit(j)
    wait_for(lambda: threads.pending() == 0)
    published = [e.split()[1] for e in recorder.events if e.startswith("published")]
    assert published == [j.pipeline for j in jobs]
    assert all(j.tracker.sealed for j in jobs)


def test_later_batches_advance_while_one_publishes(
    recorder: Recorder, threads: StageThreads
) -> None:
    for n in range(5):
        threads.submit(job(n))
    # p0 is held in its publish stage: p1 runs the model and waits to publish, p2 is
    # prepared and waits for the model; with ahead=1 p3 is not started
    wait_for(lambda: "infer p1" in recorder.events and "prepare p2" in recorder.events)
    time.sleep(0.05)
    assert "infer p2" not in recorder.events
    assert "prepare p3" not in recorder.events
    assert threads.pending() == 5
    assert threads.busy_with({("t", 0)})
    recorder.gate("p0").set()
    wait_for(lambda: "prepare p3" in recorder.events)
    for n in range(1, 5):
        recorder.gate(f"p{n}").set()
    wait_for(lambda: threads.pending() == 0)
    assert not threads.busy_with({("t", 0)})
    published = [e.split()[1] for e in recorder.events if e.startswith("published")]
    assert published == [f"p{n}" for n in range(5)]


def test_prepare_error_stops_both_stages_and_surfaces(
    recorder: Recorder, threads: StageThreads
) -> None:
    recorder.fail_prepare = "p1"
    for n in range(4):
        threads.submit(job(n))
    recorder.gate("p0").set()
    wait_for(lambda: threads.pending() == 0)
    with pytest.raises(RuntimeError, match="prepare of p1 failed"):
        threads.check()
    assert "prepare p2" not in recorder.events
    assert "infer p1" not in recorder.events


def test_discard_drops_unpublished_jobs_only(recorder: Recorder, threads: StageThreads) -> None:
    jobs = [job(n) for n in range(4)]
    for j in jobs:
        threads.submit(j)
    wait_for(lambda: "infer p1" in recorder.events and "prepare p2" in recorder.events)
    dropped = threads.discard_queued()
    # p0 is publishing and finishes; p1 (inferred), p2 (prepared) and p3 are dropped
    assert [j.pipeline for j in dropped] == ["p1", "p2", "p3"]
    recorder.gate("p0").set()
    wait_for(lambda: threads.pending() == 0)
    assert jobs[0].tracker.sealed
    assert not any(j.tracker.sealed for j in jobs[1:]), recorder.events


def test_close_finishes_queued_jobs(recorder: Recorder) -> None:
    proc = StageThreads(recorder.prepare, stages=3, ahead=1)
    jobs = [job(n) for n in range(3)]
    for j in jobs:
        recorder.gate(j.pipeline).set()
        proc.submit(j)
    assert proc.close(5.0)
    assert all(j.tracker.sealed for j in jobs)
    proc.check()

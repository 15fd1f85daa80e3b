"""The staged threads: order, overlap, bounded look-ahead, errors, rewind, close."""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.waits import wait_for
from worker.core.job import Job
from worker.core.parked import Parked
from worker.core.tracker import DeliveryTracker
from worker.loop.threads import StageThreads, Step


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


# --- priority lanes --------------------------------------------------------------------

LANES = {"live": 10, "bulk": -10}


def lane_job(pipeline: str, n: int) -> Job:
    """Job ``n`` of ``pipeline``; its one partition is the pipeline's own topic."""
    return Job(pipeline, [], DeliveryTracker(pipeline), {(pipeline, 0): n + 1})


def tag(job: Job) -> str:
    return f"{job.pipeline}{job.offsets[(job.pipeline, 0)] - 1}"


class LaneRecorder:
    """Prepare, infer, publish; a closed gate holds a job in the model (a busy model)."""

    def __init__(self, infer_s: float = 0.0) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        self.infer_s = infer_s
        self.takes: list[tuple[int, str, bool]] = []

    def log(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, stage: str) -> list[str]:
        with self.lock:
            return [e.split()[1] for e in self.events if e.split()[0] == stage]

    def on_take(self, stage: int, job: Job, waited_s: float, aged: bool) -> None:
        assert waited_s >= 0
        with self.lock:
            self.takes.append((stage, tag(job), aged))

    def prepare(self, job: Job) -> Step:
        name = tag(job)
        self.log(f"prepare {name}")

        def infer() -> Step:
            self.log(f"infer {name}")
            gate = self.gates.get(name)
            if gate is not None:
                assert gate.wait(10)
            if self.infer_s:
                time.sleep(self.infer_s)
            return publish

        def publish() -> None:
            self.log(f"publish {name}")
            job.tracker.seal()

        return infer


def lanes_threads(recorder: LaneRecorder, **kw: object) -> StageThreads:
    return StageThreads(
        recorder.prepare,
        stages=3,
        ahead=2,
        lane=lambda job: LANES[job.pipeline],
        on_take=recorder.on_take,
        **kw,  # type: ignore[arg-type]
    )


def test_interactive_jobs_overtake_waiting_bulk_jobs() -> None:
    recorder = LaneRecorder()
    recorder.gates["bulk0"] = threading.Event()
    proc = lanes_threads(recorder)
    try:
        for n in range(6):
            proc.submit(lane_job("bulk", n))
        # the model is busy with bulk0; bulk1 and bulk2 wait for it (ahead = 2), so the
        # first stage holds bulk3 back and is free for the interactive pipeline
        wait_for(lambda: recorder.of("prepare") == ["bulk0", "bulk1", "bulk2"])
        assert proc.pending(lane_at_least=LANES["live"]) == 0
        proc.submit(lane_job("live", 0))
        proc.submit(lane_job("live", 1))
        wait_for(lambda: "live1" in recorder.of("prepare"))
        assert recorder.of("prepare") == ["bulk0", "bulk1", "bulk2", "live0", "live1"]
        assert proc.pending(lane_at_least=LANES["live"]) == 2
        assert proc.pending() == 8
        recorder.gates["bulk0"].set()
        wait_for(lambda: proc.pending() == 0)
    finally:
        proc.close(5.0)
    proc.check()
    infer = recorder.of("infer")
    assert infer[:3] == ["bulk0", "live0", "live1"], infer
    assert [t for t in infer if t.startswith("bulk")] == [f"bulk{n}" for n in range(6)]
    published = recorder.of("publish")
    assert published.index("live1") < published.index("bulk1")
    assert [t for t in published if t.startswith("bulk")] == [f"bulk{n}" for n in range(6)]


def test_the_top_lane_is_prepared_as_it_comes_while_the_model_is_busy() -> None:
    """Small interactive batches all wait ready in front of the model, not two of them
    with the rest queued for room behind a long bulk batch."""
    recorder = LaneRecorder()
    recorder.gates["bulk0"] = threading.Event()
    proc = lanes_threads(recorder, top_lane=LANES["live"])
    try:
        for n in range(4):
            proc.submit(lane_job("bulk", n))
        wait_for(lambda: recorder.of("prepare") == ["bulk0", "bulk1", "bulk2"])
        for n in range(6):
            proc.submit(lane_job("live", n))
        wait_for(lambda: len(recorder.of("prepare")) == 9)
        time.sleep(0.05)
        assert "bulk3" not in recorder.of("prepare"), "the bulk lane keeps its bound"
        recorder.gates["bulk0"].set()
        wait_for(lambda: proc.pending() == 0)
    finally:
        proc.close(5.0)
    proc.check()
    assert recorder.of("infer") == [
        "bulk0",
        *[f"live{n}" for n in range(6)],
        "bulk1",
        "bulk2",
        "bulk3",
    ]


def submit_mixed(
    proc: StageThreads, rng: random.Random, count: int, pause: Callable[[], None]
) -> dict[str, list[str]]:
    """Submit ``count`` jobs of the live and bulk pipelines in a random mix, calling
    ``pause`` after each; the tags each pipeline was sent, in order."""
    sent: dict[str, list[str]] = {"live": [], "bulk": []}
    for _ in range(count):
        pipeline = rng.choice(["live", "bulk"])
        job = lane_job(pipeline, len(sent[pipeline]))
        sent[pipeline].append(tag(job))
        proc.submit(job)
        pause()
    return sent


def test_every_pipeline_keeps_its_order_however_jobs_interleave() -> None:
    recorder = LaneRecorder(infer_s=0.001)
    proc = lanes_threads(recorder)
    rng = random.Random(5)

    def pause() -> None:
        if rng.random() < 0.3:
            time.sleep(0.001)

    try:
        submitted = submit_mixed(proc, rng, 120, pause)
        wait_for(lambda: proc.pending() == 0)
    finally:
        proc.close(5.0)
    proc.check()
    for stage in ("prepare", "infer", "publish"):
        seen = recorder.of(stage)
        for pipeline, order in submitted.items():
            assert [t for t in seen if t.startswith(pipeline)] == order, stage


def test_bulk_jobs_run_whenever_the_interactive_lane_is_idle() -> None:
    recorder = LaneRecorder()
    proc = lanes_threads(recorder, max_overtaken_s=3600.0)
    try:
        for n in range(10):
            proc.submit(lane_job("bulk", n))
        wait_for(lambda: proc.pending() == 0)
    finally:
        proc.close(5.0)
    assert recorder.of("publish") == [f"bulk{n}" for n in range(10)]
    assert not any(aged for _, _, aged in recorder.takes)


def test_a_sustained_interactive_overload_still_lets_bulk_through() -> None:
    """More interactive work waits than the model can take (a second of it at least),
    so the interactive lane in front of the model never runs dry; aging still takes each
    bulk job to the model once it has been overtaken there for ``max_overtaken_s``, and
    says so."""
    recorder = LaneRecorder(infer_s=0.005)
    proc = StageThreads(
        recorder.prepare,
        ahead=8,  # room for 8 prepared interactive jobs in front of the model
        lane=lambda job: LANES[job.pipeline],
        max_overtaken_s=0.05,
        on_take=recorder.on_take,
    )
    try:
        for n in range(200):
            proc.submit(lane_job("live", n))
        proc.submit(lane_job("bulk", 0))
        proc.submit(lane_job("bulk", 1))
        wait_for(lambda: proc.pending() == 0, timeout=30)
    finally:
        proc.close(5.0)
    proc.check()
    published = recorder.of("publish")
    assert published.index("bulk1") < published.index("live199"), "bulk did not wait it out"
    model = [(name, aged) for stage, name, aged in recorder.takes if stage == 1]
    assert ("bulk0", True) in model and ("bulk1", True) in model, model
    assert not any(aged for name, aged in model if name.startswith("live"))
    assert [t for t in published if t.startswith("live")] == [f"live{n}" for n in range(200)]


class Holding:
    """Stages whose infer step raises ``Parked`` for pipeline ``a`` while ``held``."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.held = threading.Event()

    def log(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, kind: str) -> list[str]:
        with self.lock:
            return [e.split()[1] for e in self.events if e.startswith(kind)]

    def prepare(self, job: Job) -> Step:
        name = f"{job.pipeline}{min(job.offsets.values()) - 1}"
        self.log(f"prepare {name}")

        def infer() -> Step:
            if job.pipeline == "a" and self.held.is_set():
                raise Parked("waiting for its model", 0.001)
            self.log(f"infer {name}")
            return publish

        def publish() -> None:
            job.tracker.seal()
            self.log(f"published {name}")

        return infer


def test_a_parked_job_holds_its_pipeline_only_and_keeps_its_order() -> None:
    stages = Holding()
    stages.held.set()
    proc = StageThreads(stages.prepare, stages=3, ahead=1)
    try:
        for n in range(5):
            proc.submit(Job("a", [], DeliveryTracker("a"), {("ta", 0): n + 1}))
            proc.submit(Job("b", [], DeliveryTracker("b"), {("tb", 0): n + 1}))
        wait_for(lambda: len(stages.of("published")) == 5)
        assert stages.of("published") == [f"b{n}" for n in range(5)]
        assert proc.parked() == {"a"} and proc.pending() == 5
        # a0 is parked at the model; with ahead=1 only a1 waits for it, prepared
        assert stages.of("prepare").count("a0") == 1 and "a2" not in stages.of("prepare")
        assert proc.pending(lane_at_least=0) == 0, "parked jobs do not make the model busy"
        stages.held.clear()
        wait_for(lambda: proc.pending() == 0)
        assert [e for e in stages.of("published") if e[0] == "a"] == [f"a{n}" for n in range(5)]
        assert proc.parked() == frozenset()
    finally:
        stages.held.clear()
        assert proc.close(5.0)


def test_close_waits_for_a_parked_job() -> None:
    stages = Holding()
    stages.held.set()
    proc = StageThreads(stages.prepare, stages=3, ahead=1)
    proc.submit(Job("a", [], DeliveryTracker("a"), {("ta", 0): 1}))
    wait_for(lambda: proc.parked() == {"a"})
    assert not proc.close(0.05), "a parked job keeps its stage open"
    stages.held.clear()
    assert proc.close(5.0)
    assert stages.of("published") == ["a0"]


# --- hand-offs and wakes -------------------------------------------------------------


def test_a_job_that_meets_idle_stages_runs_through_on_one_thread() -> None:
    """At a steady rate a job finds every stage free: the thread that took it runs all
    its steps, so no hand-off wakes another thread; only its submission wakes one."""
    ran: dict[str, set[str]] = {}

    def note(job: Job) -> None:
        ran.setdefault(job.pipeline, set()).add(threading.current_thread().name)

    def start(job: Job) -> Step:
        note(job)

        def infer() -> Step:
            note(job)
            return lambda: note(job)

        return infer

    proc = StageThreads(start, stages=3, ahead=1)
    try:
        for n in range(5):
            proc.submit(job(n))
            wait_for(lambda: proc.pending() == 0)
        time.sleep(0.05)  # room for a wrong wake to happen
        assert proc.wakes() <= 5, "a hand-off woke a thread"
    finally:
        assert proc.close(5.0)
    proc.check()
    assert sorted(ran) == [f"p{n}" for n in range(5)]
    assert all(len(threads) == 1 for threads in ran.values()), ran


def test_stages_still_overlap_when_a_thread_runs_a_job_through() -> None:
    """The model holds bulk0 on the thread that prepared it; jobs submitted meanwhile are
    prepared by the other threads and queue for the model. Each take wakes at most one
    thread."""
    recorder = LaneRecorder()
    recorder.gates["bulk0"] = threading.Event()
    proc = lanes_threads(recorder)
    try:
        proc.submit(lane_job("bulk", 0))
        wait_for(lambda: recorder.of("infer") == ["bulk0"])
        for n in (1, 2):
            proc.submit(lane_job("bulk", n))
        wait_for(lambda: recorder.of("prepare") == ["bulk0", "bulk1", "bulk2"])
        recorder.gates["bulk0"].set()
        wait_for(lambda: proc.pending() == 0)
        time.sleep(0.05)
        assert proc.wakes() <= 9, "at most once per step taken"
    finally:
        proc.close(5.0)
    proc.check()
    assert recorder.of("publish") == ["bulk0", "bulk1", "bulk2"]


def test_a_finished_job_leaves_nothing_of_its_steps_on_the_idle_thread() -> None:
    """A published batch lets go of the engine it ran on when its last step returns,
    not when its thread takes its next job (an idle thread may wait for long): p1's
    publish waits behind p0's, so a thread takes it from the queue rather than going on
    with it."""

    class Engine:
        pass

    engines: list[weakref.ref[Engine]] = []
    gate = threading.Event()

    def start(job: Job) -> Step:
        engine = Engine()
        engines.append(weakref.ref(engine))

        def infer() -> Step:
            def publish() -> None:
                assert engine is not None
                if job.pipeline == "p0":
                    assert gate.wait(10)

            return publish

        return infer

    proc = StageThreads(start, stages=3, ahead=1)
    try:
        proc.submit(job(0))
        proc.submit(job(1))
        wait_for(lambda: proc.pending() == 2 and len(engines) == 2)
        time.sleep(0.05)  # p1 reaches the publish stage's queue
        gate.set()
        wait_for(lambda: proc.pending() == 0)
        wait_for(lambda: all(engine() is None for engine in engines), timeout=2.0)
    finally:
        gate.set()
        assert proc.close(5.0)
    proc.check()


@pytest.mark.parametrize("held", ["infer", "publish"])
def test_a_stage_waiting_for_room_goes_on_when_the_next_stage_takes(held: str) -> None:
    """With one job of room between stages, the stage before a held one stops taking;
    when the held job goes on, the stage after it makes room and must wake it (nothing
    else would: no timer, no new job)."""
    recorder = Recorder()
    gate = threading.Event()
    if held == "infer":
        original = recorder.prepare

        def prepare(job: Job) -> Step:
            infer = original(job)

            def held_infer() -> Step:
                if job.pipeline == "p0":
                    assert gate.wait(10)
                return infer()

            return held_infer

        start = prepare
    else:
        recorder.gates["p0"] = gate
        start = recorder.prepare
    proc = StageThreads(start, stages=3, ahead=1)
    try:
        for n in range(6):
            if n:
                recorder.gate(f"p{n}").set()
            proc.submit(job(n))
        # p0 held; one job waits between each two stages up to it
        last = "p1" if held == "infer" else "p2"
        wait_for(lambda: f"prepare {last}" in recorder.events)
        time.sleep(0.05)
        assert "prepare p3" not in recorder.events, "no room: the first stage waits"
        gate.set()
        recorder.gate("p0").set()
        wait_for(lambda: proc.pending() == 0, timeout=5)
    finally:
        proc.close(5.0)
    proc.check()
    published = [e.split()[1] for e in recorder.events if e.startswith("published")]
    assert published == [f"p{n}" for n in range(6)]


def test_no_hand_off_is_lost_however_stages_interleave() -> None:
    """Random step times, parked jobs and one job of room between stages: every job of
    both pipelines comes through in its order and every thread ends (a lost wake leaves a
    stage waiting for good, and this times out)."""
    rng = random.Random(11)
    lock = threading.Lock()
    published: list[str] = []

    def pause() -> None:
        with lock:
            s = rng.choice((0.0, 0.0, 0.0002, 0.001))
        if s:
            time.sleep(s)

    def start(job: Job) -> Step:
        tries = {"infer": 0}
        name = tag(job)
        pause()

        def infer() -> Step:
            pause()
            with lock:
                park = tries["infer"] == 0 and rng.random() < 0.1
            tries["infer"] += 1
            if park:
                raise Parked("model not ready", 0.001)
            return publish

        def publish() -> None:
            pause()
            with lock:
                published.append(name)

        return infer

    proc = StageThreads(start, stages=3, ahead=1, lane=lambda job: LANES[job.pipeline])
    try:
        sent = submit_mixed(proc, rng, 300, pause)
        wait_for(lambda: proc.pending() == 0, timeout=30)
    finally:
        assert proc.close(5.0), "a stage thread did not end"
    proc.check()
    for pipeline, order in sent.items():
        assert [t for t in published if t.startswith(pipeline)] == order


def test_an_error_ends_every_stage_thread_waiting_or_not() -> None:
    """The publish stage fails while the others wait for a job or for room: all end."""
    recorder = Recorder()

    def start(job: Job) -> Step:
        infer = recorder.prepare(job)

        def failing() -> Step:
            following = infer()
            if job.pipeline == "p1":
                raise RuntimeError("the model failed on p1")
            return following

        return failing

    for n in range(4):
        recorder.gate(f"p{n}").set()
    proc = StageThreads(start, stages=3, ahead=1)
    for n in range(4):
        proc.submit(job(n))
    wait_for(lambda: proc.pending() == 0)
    with pytest.raises(RuntimeError, match="failed on p1"):
        proc.check()
    assert proc.close(5.0), "a stage thread kept waiting after the error"


def test_a_job_parked_at_the_model_makes_room_for_other_pipelines_at_once() -> None:
    """a1 fills the one place in front of the model while a0 runs there, so b0 waits
    for room; when a0 parks (its model at fault for an hour on the clock), a's jobs
    leave the lane's room and b0 must go on now, not when a0 is tried again."""
    clock = FakeClock()
    entered, gate = threading.Event(), threading.Event()
    prepared: list[str] = []
    tries: list[str] = []
    published: list[str] = []

    def start(job: Job) -> Step:
        name = f"{job.pipeline}{min(job.offsets.values()) - 1}"
        prepared.append(name)

        def infer() -> Step:
            if name == "a0":
                entered.set()
                assert gate.wait(10)
                tries.append(name)
                if len(tries) == 1:
                    raise Parked("waiting for its model", 3600.0)
            return lambda: published.append(name)

        return infer

    proc = StageThreads(start, stages=3, ahead=1, clock=clock)
    try:
        for name, n in (("a", 0), ("a", 1), ("b", 0)):
            proc.submit(Job(name, [], DeliveryTracker(name), {(f"t{name}", 0): n + 1}))
        assert entered.wait(10)
        wait_for(lambda: prepared == ["a0", "a1"])
        time.sleep(0.05)
        assert prepared == ["a0", "a1"], "no room for b0 while a0 runs and a1 waits"
        gate.set()
        wait_for(lambda: published == ["b0"], timeout=5)
        assert proc.parked() == {"a"}
        clock.advance(3_600_000)
        proc.discard_queued()  # a1 waits to be prepared again; a0 goes on
        wait_for(lambda: published == ["b0", "a0"], timeout=5)
    finally:
        gate.set()
        assert proc.close(5.0)
    proc.check()

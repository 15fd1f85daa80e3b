"""worker.replay without a broker: resume positions, state, throttling, progress, and the
replay loop over a fake consumer and producer with the real pipeline and ONNX model."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson
import pytest
from confluent_kafka import KafkaError, Message, Producer

from streamfer_dev.modelgen import DemoModel
from tests.fakes.clock import FakeClock
from tests.fakes.pipeline import FakeMessage
from tests.fakes.replay import FakeProducer, FakeRangeConsumer
from worker.compose import Metrics
from worker.config import BatchPolicy, FeatureSpec, ModelSpec, PipelineConfig
from worker.core import DeliveryTracker
from worker.errors import ConfigError, SinkError
from worker.inference.engine import OnnxEngine
from worker.models import build_pipeline
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.steps import Pipeline
from worker.replay import (
    REPLAY_ID_HEADER,
    Progress,
    RateLimiter,
    Replay,
    ReplayPlan,
    ReplaySink,
    StateStore,
    default_output_topic,
    format_duration,
    format_progress,
    resume_positions,
)
from worker.tools.ranges import Bounds, PartitionRange

if TYPE_CHECKING:
    from tests.fakes.stores import StoreFactory


# --- resuming ---------------------------------------------------------------------------


def test_resume_positions_stay_inside_the_range() -> None:
    ranges = [PartitionRange("t", 0, 10, 20), PartitionRange("t", 1, 10, 20)]
    assert resume_positions(ranges, {("t", 0): None, ("t", 1): 15}) == {
        ("t", 0): 10,
        ("t", 1): 15,
    }
    assert resume_positions(ranges, {("t", 0): 3, ("t", 1): 99}) == {("t", 0): 10, ("t", 1): 20}


def test_default_output_topic() -> None:
    assert default_output_topic("results", "3") == "results.replay.3"
    with pytest.raises(ConfigError, match="--output-topic"):
        default_output_topic("results", "3 beta/2")


# --- state ------------------------------------------------------------------------------


def _plan(ranges: Sequence[PartitionRange] = (PartitionRange("req", 0, 0, 8),)) -> ReplayPlan:
    return ReplayPlan(
        replay_id="r1",
        pipeline="demo",
        output_topic="res.replay.1",
        dead_letter_topic="dlq.replay.1",
        model_path="/models/m.onnx",
        model_name="m",
        model_version="1",
        model_sha256="ab" * 32,
        ranges=tuple(ranges),
        bounds=Bounds(from_time_ms=5).describe(),
        created_at="2026-01-01T00:00:00Z",
    )


def test_state_round_trips_and_is_locked_per_replay(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    plan = _plan([PartitionRange("req", 0, 3, 9), PartitionRange("req", 1, 0, 4)])
    path = store.save(plan)
    assert path == tmp_path / "state" / "r1.json"
    assert store.load("r1") == plan
    with store.lock("r1"), pytest.raises(ConfigError, match="another process"), store.lock("r1"):
        pass
    with store.lock("r1"):  # released
        pass
    with pytest.raises(ConfigError, match="does not exist"):
        store.load("r2")
    with pytest.raises(ConfigError, match="replay id"):
        store.path("../etc")


# --- throttling and progress ------------------------------------------------------------


def test_rate_limiter_allows_rate_per_second_in_bursts() -> None:
    clock = FakeClock()
    limiter = RateLimiter(100, clock=clock)
    assert limiter.burst == 10
    assert limiter.allowance(256) == 10
    limiter.take(10)
    assert limiter.allowance(256) == 0
    assert limiter.wait_s() == pytest.approx(0.01)
    clock.now += 0.05
    assert limiter.allowance(256) == 5
    clock.now += 100  # idle time does not build up more than one burst
    assert limiter.allowance(256) == 10
    taken = 0
    for _ in range(1000):  # 10 s of 10 ms steps
        clock.now += 0.01
        n = limiter.allowance(256)
        limiter.take(n)
        taken += n
    assert 995 <= taken <= 1010


def test_format_duration_and_progress() -> None:
    assert format_duration(None) == "?"
    assert format_duration(41.6) == "42s"
    assert format_duration(185) == "3m05s"
    assert format_duration(7620) == "2h07m"
    line = format_progress(1200, 4000, 1.5, width=10)
    assert line == "[###-------] 1,200/4,000  30.0% 800 rec/s ETA 4s"
    assert format_progress(0, 4000, 0.0).endswith("ETA ?")
    assert "100.0%" in format_progress(5, 0, 1.0)


def test_progress_without_a_terminal_writes_a_line_every_interval() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress(100, label="replay x", stream=out, every_s=5.0, clock=clock)
    progress.update(10)
    assert out.getvalue() == ""
    clock.now += 5.0
    progress.update(50)
    clock.now += 1.0
    progress.update(60)
    progress.finish(100)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("replay x [") and "50/100" in lines[0]
    assert "100/100 100.0%" in lines[1]


# --- the loop over fakes ----------------------------------------------------------------


@pytest.fixture
def pipeline(classifier: DemoModel, make_store: StoreFactory) -> Pipeline:
    features = classifier.features[:5].tolist()
    store = make_store(
        {f"e{i}": {f: repr(v) for f, v in zip(classifier.fields, row, strict=True)}
         for i, row in enumerate(features)},
        classifier.fields,
    )  # fmt: skip
    config = PipelineConfig(
        name="demo",
        request_topics=["req"],
        result_topic="res.replay.1",
        dead_letter_topic="dlq.replay.1",
        features=FeatureSpec(fields=classifier.fields),
        model=ModelSpec(path=classifier.path, name="m", version="1"),
    )
    engine = OnnxEngine(config.model)
    return build_pipeline(
        config,
        store=store,
        engine=engine,
        plan=FeedPlan.build(config, engine.inputs),
        metrics=Metrics().for_pipeline("demo"),
    )


def _log(n: int, partition: int, skip: Sequence[int] = (), bad: Sequence[int] = ()) -> Any:
    values = {}
    for o in range(n):
        if o in skip:
            continue
        rid = f"p{partition}-{o}"
        values[o] = b"{" if o in bad else orjson.dumps({"id": rid, "entity": f"e{o % 5}"})
    return values


def _replay(
    plan: ReplayPlan,
    consumer: FakeRangeConsumer,
    producer: FakeProducer,
    pipeline: Pipeline,
    positions: dict[tuple[str, int], int] | None = None,
) -> Replay:
    return Replay(
        plan=plan,
        positions=positions or {r.key: r.start for r in plan.ranges},
        consumer=consumer,  # type: ignore[arg-type]
        sink=ReplaySink(producer, "r1", "dlq.replay.1"),  # type: ignore[arg-type]
        pipeline=pipeline,
        batch=BatchPolicy(max_batch_size=4, max_wait_ms=0),
        checkpoint_interval_s=0.0,
    )


def _sources(producer: FakeProducer) -> list[tuple[int, int]]:
    out = []
    for _topic, _value, headers in producer.delivered:
        h = dict(headers)
        out.append((int(h["streamfer.source_partition"]), int(h["streamfer.source_offset"])))
    return out


def test_replay_reads_exactly_its_ranges_and_checkpoints_their_ends(pipeline: Pipeline) -> None:
    # p0 holds 20 records but the range is [5, 15): later ones are live traffic.
    # p1's last offsets (6, 7) are transaction markers, so its range ends at EOF.
    logs = {("req", 0): _log(20, 0, bad=[7]), ("req", 1): _log(8, 1, skip=[6, 7])}
    consumer = FakeRangeConsumer(logs, {("req", 0): 20, ("req", 1): 8})
    producer = FakeProducer()
    plan = _plan([PartitionRange("req", 0, 5, 15), PartitionRange("req", 1, 0, 8)])
    replay = _replay(plan, consumer, producer, pipeline)
    replay.run()

    assert replay.complete
    assert sorted(_sources(producer)) == [(0, o) for o in range(5, 15)] + [(1, o) for o in range(6)]
    assert replay.records == 16
    assert (replay.results, replay.dead_letters, replay.checkpointed) == (15, 1, 16)
    assert replay.per_partition == {("req", 0): 10, ("req", 1): 6}
    assert consumer.committed() == {("req", 0): 15, ("req", 1): 8}
    assert replay.checkpoints == {("req", 0): 15, ("req", 1): 8}
    assert consumer.paused == {("req", 0), ("req", 1)}
    for topic, _value, headers in producer.delivered:
        assert (REPLAY_ID_HEADER, b"r1") in headers
        assert topic in ("res.replay.1", "dlq.replay.1")
    previous: dict[tuple[str, int], int] = {}
    for commit in consumer.commits:
        for key, offset in commit.items():
            assert offset >= previous.get(key, 0), "checkpoints never go backwards"
            previous[key] = offset


def test_stopped_replay_resumes_from_its_checkpoint_without_a_gap(pipeline: Pipeline) -> None:
    logs = {("req", 0): _log(30, 0), ("req", 1): _log(30, 1)}
    ends = {("req", 0): 30, ("req", 1): 30}
    plan = _plan([PartitionRange("req", 0, 0, 30), PartitionRange("req", 1, 10, 30)])
    first = FakeRangeConsumer(logs, ends)
    producer = FakeProducer()
    replay = _replay(plan, first, producer, pipeline)

    def stop_after_three(consumer: FakeRangeConsumer) -> None:
        if consumer.consumed == 3:
            replay.stop()

    first.on_consume = stop_after_three
    replay.run()
    assert not replay.complete
    assert replay.records == replay.checkpointed > 0
    checkpoint = first.committed()
    assert checkpoint == {k: v for k, v in replay.checkpoints.items() if k in checkpoint}

    positions = resume_positions(plan.ranges, dict(checkpoint))
    second = FakeRangeConsumer(logs, ends)
    resumed = _replay(replay_plan := replace(plan), second, producer, pipeline, positions)
    resumed.run()
    assert resumed.complete and replay_plan == plan
    expected = [(0, o) for o in range(30)] + [(1, o) for o in range(10, 30)]
    assert sorted(set(_sources(producer))) == expected
    assert second.committed() == {("req", 0): 30, ("req", 1): 30}


def test_a_result_the_broker_refuses_becomes_its_dead_letter_and_the_replay_goes_on(
    pipeline: Pipeline,
) -> None:
    logs = {("req", 0): _log(20, 0)}
    consumer = FakeRangeConsumer(logs, {("req", 0): 20})
    producer = FakeProducer(fail={"p0-9"})
    replay = _replay(_plan([PartitionRange("req", 0, 0, 20)]), consumer, producer, pipeline)
    replay.run()
    assert replay.complete
    assert (replay.results, replay.dead_letters, replay.checkpointed) == (19, 1, 20)
    dead = [orjson.loads(v) for t, v, _ in producer.delivered if t == "dlq.replay.1"]
    assert [(d["request_id"], d["code"]) for d in dead] == [("p0-9", "result_refused")]
    assert consumer.committed() == {("req", 0): 20}


def test_a_failed_delivery_fails_the_replay_and_is_never_checkpointed(
    pipeline: Pipeline,
) -> None:
    logs = {("req", 0): _log(20, 0)}
    consumer = FakeRangeConsumer(logs, {("req", 0): 20})
    producer = FakeProducer(fail={"p0-9"}, error=KafkaError._MSG_TIMED_OUT)
    replay = _replay(_plan([PartitionRange("req", 0, 0, 20)]), consumer, producer, pipeline)
    with pytest.raises(SinkError, match="timed out"):
        replay.run()
    assert not replay.complete
    assert consumer.committed().get(("req", 0), 0) <= 9


def test_a_resent_record_carries_the_replay_id_once() -> None:
    """A record re-sent as it was (a batch-mate's refusal failed it) keeps its headers,
    the replay's id among them, and gains no second one."""
    producer = FakeProducer()
    sink = ReplaySink(cast(Producer, producer), "r1", "dlq.replay.1")
    tracker = DeliveryTracker("demo")
    sink.send(tracker, "res.replay.1", b'{"id": "a"}', b"k", [("streamfer.source_offset", b"7")])
    topic, value, key, headers, _on_delivery = producer.pending[0]
    assert headers == [("streamfer.source_offset", b"7"), (REPLAY_ID_HEADER, b"r1")]
    sent = FakeMessage(value, 0, key=key, topic=topic, headers=headers)
    sink.resend(tracker, cast(Message, sent))
    assert producer.pending[1][3] == headers

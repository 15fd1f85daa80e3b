"""Pipeline.handle with the real ONNX engine, an in-memory store and a recording sink."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pytest
from confluent_kafka import Message

from streamfer_dev.modelgen import DemoModel
from tests.fakes.pipeline import (
    MAX_RECORD_BYTES,
    NAN_ROW,
    POISON,
    FakeMessage,
    NanEngine,
    PipelineFactory,
    PoisonEngine,
    WrappedEngine,
    expected_scores,
    handle,
    inline_row,
    messages,
    req,
)
from tests.fakes.sink import FakeSink, Sent
from worker.compose import Metrics
from worker.config import HooksSpec, PipelineConfig
from worker.errors import ConfigError, FeatureStoreError, ModelMismatchError
from worker.features.stores import RowStore
from worker.inference.engine import OnnxEngine
from worker.kafka.limits import RecordLimits, record_size
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.hooks import BatchHooks, load_hooks

if TYPE_CHECKING:
    from tests.fakes.stores import MemoryStore

# --- tests ------------------------------------------------------------------------------


def test_every_message_yields_exactly_one_record(
    make_pipeline: PipelineFactory,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
    store: MemoryStore,
    metrics: Metrics,
) -> None:
    values: list[bytes | None] = [
        req("r0", "e0"),  # 100: result
        b"{not json",  # 101: decode / invalid_json
        req("r2", "e2"),  # 102: result
        req("r3", "ghost"),  # 103: features / unknown_entity
        None,  # 104: decode / empty_value
        req("r5", features=inline_row(classifier, 5)),  # 105: result, no lookup
        req("r6", "e6", {"zzz": 1.0}),  # 106: schema / unknown_feature
        b" " * (MAX_RECORD_BYTES + 1),  # 107: decode / oversized
        req("r8", "e0"),  # 108: result (same entity as r0)
    ]
    pipeline = make_pipeline()
    tracker, offsets = handle(pipeline, messages(values), sink)

    assert len(sink.sent) == len(values)
    assert tracker.sent == len(values)
    assert tracker.pending == len(values)
    assert offsets == {("req", 0): 109}
    # one store round trip for the batch, distinct entities only
    assert store.calls == [["e0", "e2", "ghost"]]

    by_offset = sink.by_offset()
    assert sorted(by_offset) == list(range(100, 109))
    results = {o for o, s in by_offset.items() if s.topic == "res"}
    assert results == {100, 102, 105, 108}
    dead = {o: s for o, s in by_offset.items() if s.topic == "dlq"}
    codes = {o: s.header("streamfer.error_code") for o, s in dead.items()}
    assert codes == {
        101: b"invalid_json",
        103: b"unknown_entity",
        104: b"empty_value",
        106: b"unknown_feature",
        107: b"oversized",
    }
    stages = {o: s.header("streamfer.error_stage") for o, s in dead.items()}
    assert stages == {
        101: b"decode",
        103: b"features",
        104: b"decode",
        106: b"schema",
        107: b"decode",
    }

    scores = expected_scores(onnx_engine, classifier, [0, 2, 5, 0])
    for offset, rid, want in zip(
        [100, 102, 105, 108], ["r0", "r2", "r5", "r8"], scores, strict=True
    ):
        body = by_offset[offset].body
        assert body["id"] == rid
        np.testing.assert_allclose(body["outputs"]["scores"], want, rtol=1e-6)
        assert body["outputs"]["label"] == int(np.argmax(want))

    sample = metrics.registry.get_sample_value
    assert sample("streamfer_records_total", {"pipeline": "p"}) == len(values)
    assert sample("streamfer_results_total", {"pipeline": "p"}) == 4
    assert sample("streamfer_batches_total", {"pipeline": "p"}) == 1
    assert sample("streamfer_dead_letters_total", {"pipeline": "p", "code": "oversized"}) == 1


def test_result_record_shape(
    make_pipeline: PipelineFactory, sink: FakeSink, onnx_engine: OnnxEngine
) -> None:
    batch = [FakeMessage(req("abc", "e1"), 42, key=b"user-1", partition=3, ts_ms=1234)]
    handle(make_pipeline(), batch, sink)
    (out,) = sink.sent
    assert out.topic == "res"
    assert out.key == b"user-1"
    body = out.body
    assert body["id"] == "abc"
    assert body["key"] == "user-1"
    assert body["pipeline"] == "p"
    assert body["request_ts_ms"] == 1234
    assert body["model"] == {"name": "demo", "version": "3"}
    assert set(body) == {"id", "key", "outputs", "model", "pipeline", "request_ts_ms"}
    assert out.header("streamfer.request_id") == b"abc"
    assert out.header("streamfer.source_topic") == b"req"
    assert out.header("streamfer.source_partition") == b"3"
    assert out.header("streamfer.source_offset") == b"42"


def test_result_details_add_the_model_digest_and_the_batch_timings(
    make_pipeline: PipelineFactory, sink: FakeSink, onnx_engine: OnnxEngine, config: PipelineConfig
) -> None:
    batch = [FakeMessage(req("abc", "e1"), 42, key=b"user-1", partition=3, ts_ms=1234)]
    handle(make_pipeline(config=config.model_copy(update={"result_details": True})), batch, sink)
    (out,) = sink.sent
    body = out.body
    assert body["model"] == {"name": "demo", "version": "3", "sha256": onnx_engine.model_hash}
    assert set(body["timings_ms"]) == {"wait_ms", "decode_ms", "enrich_ms", "infer_ms"}
    assert (body["id"], body["pipeline"], body["request_ts_ms"]) == ("abc", "p", 1234)


def test_dead_letter_record_shape(make_pipeline: PipelineFactory, sink: FakeSink) -> None:
    value = req("r1", "e1", {"f0": "high"})  # type: ignore[dict-item]
    batch = [FakeMessage(value, 7, key=b"k", partition=1, ts_ms=99)]
    handle(make_pipeline(), batch, sink)
    (out,) = sink.sent
    assert out.topic == "dlq"
    assert out.key == b"k"
    assert out.header("streamfer.error_stage") == b"schema"
    assert out.header("streamfer.error_code") == b"wrong_type"
    reason = out.header("streamfer.error_reason")
    assert isinstance(reason, bytes)
    assert b"f0" in reason
    assert out.header("streamfer.source_offset") == b"7"
    assert out.header("streamfer.source_partition") == b"1"
    body = out.body
    assert body["code"] == "wrong_type"
    assert body["stage"] == "schema"
    assert body["model"] == "demo:3"
    assert body["source"] == {"topic": "req", "partition": 1, "offset": 7, "timestamp_ms": 99}
    assert base64.b64decode(body["value_b64"]) == value


def test_feature_stage_dead_letter_carries_request_id(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    handle(make_pipeline(), messages([req("who", "ghost")]), sink)
    (out,) = sink.sent
    assert out.header("streamfer.request_id") == b"who"
    assert out.body["request_id"] == "who"


def test_oversized_dead_letter_omits_value(make_pipeline: PipelineFactory, sink: FakeSink) -> None:
    handle(make_pipeline(), messages([b"x" * (MAX_RECORD_BYTES + 1)]), sink)
    (out,) = sink.sent
    assert out.body["value_b64"] is None
    assert out.body["value_bytes"] == MAX_RECORD_BYTES + 1
    assert out.header("streamfer.error_code") == b"oversized"


def test_bisection_isolates_failing_row(
    make_pipeline: PipelineFactory,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
) -> None:
    engine = PoisonEngine(onnx_engine)
    pipeline = make_pipeline(engine)
    values = [req(f"r{i}", f"e{i}") for i in range(7)]
    values[4] = req("r4", features=inline_row(classifier, 4, f0=POISON))
    tracker, _ = handle(pipeline, messages(values, start=0), sink)

    assert tracker.sent == 7
    assert len(engine.calls) > 1  # the first call failed and was split
    assert engine.calls[0] == 7
    by_offset = sink.by_offset()
    dead = by_offset[4]
    assert dead.topic == "dlq"
    assert dead.header("streamfer.error_code") == b"model_error"
    assert dead.header("streamfer.error_stage") == b"infer"
    assert dead.body["request_id"] == "r4"
    assert "poison row in batch" in dead.body["reason"]

    good = [0, 1, 2, 3, 5, 6]
    assert [o for o, s in sorted(by_offset.items()) if s.topic == "res"] == good
    # results stay aligned with their rows after stitching the halves back together
    for offset, want in zip(good, expected_scores(onnx_engine, classifier, good), strict=True):
        body = by_offset[offset].body
        assert body["id"] == f"r{offset}"
        np.testing.assert_allclose(body["outputs"]["scores"], want, rtol=1e-6)


def test_bisection_with_several_failing_rows(
    make_pipeline: PipelineFactory,
    sink: FakeSink,
    classifier: DemoModel,
    onnx_engine: OnnxEngine,
) -> None:
    pipeline = make_pipeline(PoisonEngine(onnx_engine))
    poisoned = {0, 5, 6, 12}
    values = [
        req(f"r{i}", features=inline_row(classifier, i, f0=POISON if i in poisoned else None))
        for i in range(13)
    ]
    handle(pipeline, messages(values, start=0), sink)
    by_offset = sink.by_offset()
    assert len(by_offset) == 13
    assert {o for o, s in by_offset.items() if s.topic == "dlq"} == poisoned
    for o in poisoned:
        assert by_offset[o].header("streamfer.error_code") == b"model_error"


def test_every_row_failing(
    make_pipeline: PipelineFactory, sink: FakeSink, classifier: DemoModel, onnx_engine: OnnxEngine
) -> None:
    pipeline = make_pipeline(PoisonEngine(onnx_engine))
    values = [req(f"r{i}", features=inline_row(classifier, i, f0=POISON)) for i in range(3)]
    tracker, _ = handle(pipeline, messages(values), sink)
    assert tracker.sent == 3
    assert [s.topic for s in sink.sent] == ["dlq"] * 3
    assert {s.header("streamfer.error_code") for s in sink.sent} == {b"model_error"}


def test_non_finite_model_output(
    make_pipeline: PipelineFactory, sink: FakeSink, classifier: DemoModel, onnx_engine: OnnxEngine
) -> None:
    pipeline = make_pipeline(NanEngine(onnx_engine))
    values = [req(f"r{i}", features=inline_row(classifier, i)) for i in range(4)]
    values[2] = req("r2", features=inline_row(classifier, 2, f0=NAN_ROW))
    handle(pipeline, messages(values, start=0), sink)
    by_offset = sink.by_offset()
    assert [o for o, s in sorted(by_offset.items()) if s.topic == "res"] == [0, 1, 3]
    dead = by_offset[2]
    assert dead.topic == "dlq"
    assert dead.header("streamfer.error_code") == b"model_non_finite"
    assert dead.header("streamfer.error_stage") == b"infer"


def test_offsets_per_partition(make_pipeline: PipelineFactory, sink: FakeSink) -> None:
    batch = [
        FakeMessage(req("a", "e1"), 10, partition=0),
        FakeMessage(b"bad", 4, partition=1),
        FakeMessage(req("b", "e2"), 11, partition=0),
        FakeMessage(req("c", "e3"), 5, partition=1),
        FakeMessage(req("d", "e4"), 0, topic="req2", partition=0),
    ]
    _, offsets = handle(make_pipeline(), batch, sink)
    assert offsets == {("req", 0): 12, ("req", 1): 6, ("req2", 0): 1}
    assert len(sink.sent) == 5


def test_all_bad_batch_skips_store_and_model(
    make_pipeline: PipelineFactory, sink: FakeSink, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = WrappedEngine(onnx_engine)
    tracker, offsets = handle(make_pipeline(engine), messages([b"[]", b"", b"{"]), sink)
    assert store.calls == []
    assert engine.calls == []
    assert [s.topic for s in sink.sent] == ["dlq"] * 3
    assert tracker.sent == 3
    assert offsets == {("req", 0): 103}


def test_feature_store_error_propagates_without_retry(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    class DownStore(RowStore):
        fields = ("a", "b", "c")

        def __init__(self) -> None:
            self.calls = 0

        def get_many(self, entities: Sequence[str]) -> list[list[bytes | None]]:
            self.calls += 1
            raise FeatureStoreError("redis is down")

    down = DownStore()
    pipeline = make_pipeline(store=down, retry_feature_store_s=0.0)
    with pytest.raises(FeatureStoreError, match="redis is down"):
        handle(pipeline, messages([b"oops", req("r", "e1")]), sink)
    assert down.calls == 1
    # nothing of the batch is produced, not even its decode-stage dead letter: the
    # whole batch is consumed again, so a dead letter sent now would be sent twice
    assert sink.sent == []


def test_model_width_must_match_fields(config: PipelineConfig, onnx_engine: OnnxEngine) -> None:
    narrow = PipelineConfig.model_validate(
        {**config.model_dump(exclude={"lookups"}), "features": {"fields": ["a", "b"]}}
    )
    with pytest.raises(ModelMismatchError, match=r"takes 30 columns but 2 features feed it"):
        FeedPlan.build(narrow, onnx_engine.inputs)


def test_traceparent_of_a_request_is_carried_to_its_result(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = FakeMessage(
        b'{"id": "t1", "entity": "e0"}', 0, headers=[("x-other", b"1"), ("traceparent", trace)]
    )
    plain = FakeMessage(b'{"id": "t2", "entity": "e0"}', 1)
    make_pipeline().handle([traced, plain], sink)  # type: ignore[list-item]
    by_id = {dict(s.headers)["streamfer.request_id"]: dict(s.headers) for s in sink.sent}
    assert by_id[b"t1"]["traceparent"] == trace
    assert "traceparent" not in by_id[b"t2"]


def test_source_headers_off_leaves_only_the_trace_context(
    config: PipelineConfig, make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    pipeline = make_pipeline(config=config.model_copy(update={"source_headers": False}))
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = FakeMessage(b'{"id": "t1", "entity": "e0"}', 0, headers=[("traceparent", trace)])
    plain = FakeMessage(b'{"id": "t2", "entity": "e0"}', 1)
    bad = FakeMessage(b'{"id": "t3", "entity": "nobody"}', 2)
    pipeline.handle([traced, plain, bad], sink)  # type: ignore[list-item]
    results = {s.body["id"]: s for s in sink.to("res")}
    assert results["t1"].headers == [("traceparent", trace)]
    assert results["t2"].headers == []
    # dead letters keep where they came from whatever the setting
    (dead,) = sink.to("dlq")
    assert dead.header("streamfer.source_offset") == b"2"
    assert dead.header("streamfer.error_code") == b"unknown_entity"


# --- records over what their topic takes -----------------------------------------------


def test_a_result_over_its_topics_limit_becomes_a_dead_letter_that_fits(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    sink.limit = RecordLimits(1_000_000, {"res": 1_200, "dlq": 3_000})
    batch = [
        FakeMessage(req("small", "e1"), 1, key=b"k"),
        FakeMessage(req("big", "e2"), 2, key=b"K" * 900),  # key twice: over 1,200 - 512
        FakeMessage(req("after", "e3"), 3, key=b"k"),
    ]
    tracker, _ = handle(make_pipeline(), batch, sink)
    assert [s.body["id"] for s in sink.to("res")] == ["small", "after"]
    (dead,) = sink.to("dlq")
    assert (dead.body["code"], dead.body["stage"], dead.body["request_id"]) == (
        "result_too_large",
        "publish",
        "big",
    )
    assert "res takes 688" in dead.body["reason"]
    assert record_size(dead.value, dead.key, dead.headers) <= sink.limit("dlq")
    assert tracker.sent == 3 and tracker.sealed


def test_a_record_the_producer_refuses_for_size_becomes_a_dead_letter(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    # the topic limits say nothing (not readable), librdkafka's message.max.bytes refuses
    sink.limit = RecordLimits(100_000, {"res": 10**9, "dlq": 10**9})
    batch = [FakeMessage(req("big", "e2"), 2, key=b"K" * 60_000)]
    handle(make_pipeline(), batch, sink)
    assert not sink.to("res")
    assert [s.body["code"] for s in sink.to("dlq")] == ["result_too_large"]


def test_a_keyless_result_for_a_compacted_topic_is_dead_lettered_before_produce(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    sink.limit = RecordLimits(1_000_000, {}, compacted={"res"})
    batch = [
        FakeMessage(req("keyed", "e1"), 1, key=b"k"),
        FakeMessage(req("keyless", "e2"), 2),
        FakeMessage(req("after", "e3"), 3, key=b"k"),
    ]
    tracker, _ = handle(make_pipeline(), batch, sink)
    assert [s.body["id"] for s in sink.to("res")] == ["keyed", "after"]
    (dead,) = sink.to("dlq")
    assert (dead.body["stage"], dead.body["code"], dead.body["request_id"]) == (
        "publish",
        "result_refused",
        "keyless",
    )
    assert dead.body["reason"] == (
        "res cannot take the result: compacted topic needs a key, and the request has none"
    )
    assert tracker.sent == 3 and not tracker.errors


def test_a_keyless_result_for_a_topic_that_does_not_compact_is_published(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    sink.limit = RecordLimits(1_000_000, {}, compacted={"dlq"})
    handle(make_pipeline(), [FakeMessage(req("keyless", "e2"), 2)], sink)
    assert [s.body["id"] for s in sink.to("res")] == ["keyless"]
    assert not sink.to("dlq")


def test_a_dead_letter_the_producer_refuses_even_bare_fails_the_batch(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    sink.limit = RecordLimits(300, {"dlq": 10**9})  # smaller than any dead letter
    tracker, _ = handle(make_pipeline(), [FakeMessage(b"{", 1)], sink)
    assert tracker.errors and "too large for this topic" in tracker.errors[0]


class RefusedReport:
    """A delivery report's message: what the broker refused, without headers."""

    def __init__(self, sent: Sent) -> None:
        self._sent = sent

    def topic(self) -> str:
        return self._sent.topic

    def partition(self) -> int:
        return 0

    def value(self) -> bytes:
        return self._sent.value

    def key(self) -> bytes | None:
        return self._sent.key

    def headers(self) -> None:
        return None


def refused(sent: Sent) -> Message:
    return cast(Message, RefusedReport(sent))


@pytest.mark.parametrize("source_headers", [True, False])
def test_a_result_the_broker_refuses_becomes_its_requests_dead_letter(
    config: PipelineConfig, make_pipeline: PipelineFactory, sink: FakeSink, source_headers: bool
) -> None:
    pipeline = make_pipeline(config=config.model_copy(update={"source_headers": source_headers}))
    batch = [FakeMessage(req("same", "e1"), 7, key=b"a"), FakeMessage(req("same", "e2"), 8)]
    tracker, _ = handle(pipeline, batch, sink)
    keyless = sink.to("res")[1]  # a compacted topic refuses a record without a key
    pipeline.dead_letter_undelivered(sink, tracker, refused(keyless), "Broker: Invalid record")
    (dead,) = sink.to("dlq")
    assert dead.body["code"] == "result_refused"
    assert dead.body["source"]["offset"] == 8, "the request with that id and no key"
    assert dead.body["request_id"] == "same"
    assert "res refused the result: Broker: Invalid record" in dead.body["reason"]


def test_a_dead_letter_the_broker_refuses_goes_again_bare_then_fails_the_batch(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    pipeline = make_pipeline()
    tracker, _ = handle(pipeline, [FakeMessage(b"{", 5, key=b"key")], sink)
    first = sink.to("dlq")[0]
    assert first.body["value_b64"] is not None
    pipeline.dead_letter_undelivered(sink, tracker, refused(first), "Broker: too large")
    bare = sink.to("dlq")[1]
    assert (bare.body["code"], bare.body["source"]["offset"]) == ("invalid_json", 5)
    assert bare.body["value_b64"] is None and bare.body["key_b64"] is None and bare.key is None
    assert "the original key and value are left out" in bare.body["reason"]
    assert not tracker.errors
    pipeline.dead_letter_undelivered(sink, tracker, refused(bare), "Broker: too large")
    assert len(sink.to("dlq")) == 2
    assert tracker.errors and "refuses even a bare dead letter" in tracker.errors[0]


# --- batch hooks ------------------------------------------------------------------------


def _docs(sink: FakeSink, topic: str) -> list[dict[str, Any]]:
    return [s.body for s in sink.sent if s.topic == topic]


def test_hooks_run_once_per_batch_around_the_model(
    make_pipeline: PipelineFactory, sink: FakeSink, classifier: DemoModel, onnx_engine: OnnxEngine
) -> None:
    seen: list[tuple[int, list[str]]] = []

    def prepare(requests: Sequence[Any], inputs: Any) -> Any:
        seen.append((len(requests), [r["id"] for r in requests]))
        (x,) = inputs.values()
        return {"X": (x * 1.5).astype(np.float32)}

    def postprocess(requests: Sequence[Any], outputs: Any) -> Any:
        p = outputs["scores"][:, 1]
        return {"fraud": p > 0.5, "score": p, "tag": np.array([r["id"] for r in requests])}

    pipeline = make_pipeline(hooks=BatchHooks(prepare, postprocess))
    handle(pipeline, messages([req("r0", "e0"), b"bad", req("r2", "e2")]), sink)
    assert seen == [(2, ["r0", "r2"])]
    scaled = (classifier.features[[0, 2]] * 1.5).astype(np.float32)
    expected = onnx_engine.infer(scaled)["scores"][:, 1].tolist()
    results = _docs(sink, "res")
    assert [r["outputs"]["tag"] for r in results] == ["r0", "r2"]
    assert [r["outputs"]["score"] for r in results] == pytest.approx(expected, abs=1e-6)
    assert [r["outputs"]["fraud"] for r in results] == [p > 0.5 for p in expected]


def test_a_hook_that_raises_on_one_row_dead_letters_that_row_only(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    def prepare(requests: Sequence[Any], inputs: Any) -> Any:
        if any(r["id"] == "r1" for r in requests):
            raise KeyError("no such merchant")
        return inputs

    pipeline = make_pipeline(hooks=BatchHooks(prepare=prepare))
    handle(pipeline, messages([req(f"r{i}", f"e{i}") for i in range(5)]), sink)
    assert sorted(r["id"] for r in _docs(sink, "res")) == ["r0", "r2", "r3", "r4"]
    (dead,) = _docs(sink, "dlq")
    assert (dead["request_id"], dead["code"]) == ("r1", "model_error")
    assert "prepare hook raised KeyError" in dead["reason"]


def test_a_postprocess_that_returns_the_wrong_rows_fails_its_rows(
    make_pipeline: PipelineFactory, sink: FakeSink
) -> None:
    def postprocess(requests: Sequence[Any], outputs: Any) -> Any:
        return {"score": np.zeros(len(requests) + 1)}

    pipeline = make_pipeline(hooks=BatchHooks(postprocess=postprocess))
    handle(pipeline, messages([req("r0", "e0"), req("r1", "e1")]), sink)
    assert _docs(sink, "res") == []
    dead = _docs(sink, "dlq")
    assert [d["code"] for d in dead] == ["model_error", "model_error"]
    assert "postprocess hook returned 'score' with shape (2,) for 1 rows" in dead[0]["reason"]


def test_hooks_load_by_name_and_a_bad_name_is_a_config_error() -> None:
    hooks = load_hooks(HooksSpec(postprocess="json:dumps"), "pipelines.p")
    assert hooks.postprocess is not None and hooks.prepare is None
    with pytest.raises(ConfigError, match=r"hooks.prepare: cannot import 'nowhere_x.mod'"):
        load_hooks(HooksSpec(prepare="nowhere_x.mod:f"), "pipelines.p")
    with pytest.raises(ConfigError, match=r"module 'json' has no function 'nope'"):
        load_hooks(HooksSpec(prepare="json:nope"), "pipelines.p")

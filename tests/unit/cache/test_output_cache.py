"""The output cache inside a Pipeline: the real ONNX engine, an in-memory store, a
recording sink, no Redis (the Redis tier: tests/integration/test_output_cache.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streamfer_dev.modelgen import DemoModel
from tests.fakes.pipeline import (
    NAN_ROW,
    POISON,
    FakeMessage,
    NanEngine,
    PoisonEngine,
    WrappedEngine,
    inline_row,
    req,
)
from tests.fakes.sink import FakeSink, Sent
from tests.integration.helpers import assert_valid, validator
from worker.cache.keys import KEY_BYTES
from worker.cache.memory import ENTRY_OVERHEAD
from worker.cache.output_cache import OutputCache, open_cache
from worker.cli import main
from worker.compose import Metrics
from worker.config import CacheSpec, FeatureSpec, ModelSpec, PipelineConfig, parse_config
from worker.errors import ConfigError
from worker.inference.engine import InferenceEngine, OnnxEngine
from worker.models import build_pipeline
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.hooks import BatchHooks

if TYPE_CHECKING:
    from tests.fakes.stores import MemoryStore, StoreFactory

CACHED = b',"cached":true'


@pytest.fixture(scope="module")
def onnx_engine(classifier: DemoModel) -> OnnxEngine:
    return OnnxEngine(ModelSpec(path=classifier.path, name="demo"))


def pipeline_config(classifier: DemoModel, **cache: Any) -> PipelineConfig:
    return PipelineConfig(
        name="p",
        request_topics=["req"],
        result_topic="res",
        dead_letter_topic="dlq",
        features=FeatureSpec(fields=classifier.fields, on_missing_entity="dead_letter"),
        model=ModelSpec(path=classifier.path, name="demo", version="3"),
        cache=CacheSpec(enabled=True, **cache),
    )


@pytest.fixture
def store(make_store: StoreFactory, classifier: DemoModel) -> MemoryStore:
    data = {
        f"e{i}": {f: repr(float(v)).encode() for f, v in zip(classifier.fields, row, strict=True)}
        for i, row in enumerate(classifier.features[:50].tolist())
    }
    return make_store(data, classifier.fields)


class Harness:
    """A cached and an uncached pipeline over the same engine and store."""

    def __init__(
        self,
        classifier: DemoModel,
        store: MemoryStore,
        engine: InferenceEngine,
        **cache: Any,
    ) -> None:
        self.metrics = Metrics(CollectorRegistry())
        config = pipeline_config(classifier, **cache)
        built = open_cache(config, _unused_redis(), self.metrics, engine)
        assert built is not None
        self.cache: OutputCache = built
        self.engine = engine
        plan = FeedPlan.build(config, engine.inputs)
        self.cached = build_pipeline(
            config,
            store=store,
            engine=engine,
            plan=plan,
            metrics=self.metrics.for_pipeline("p"),
            cache=self.cache,
        )
        self.plain = build_pipeline(
            config.model_copy(update={"cache": CacheSpec()}),
            store=store,
            engine=engine,
            plan=plan,
            metrics=Metrics(CollectorRegistry()).for_pipeline("p"),
        )
        self.offset = 0

    def batch(self, values: Sequence[bytes]) -> list[FakeMessage]:
        start, self.offset = self.offset, self.offset + len(values)
        return [
            FakeMessage(v, start + i, key=f"k{start + i}".encode()) for i, v in enumerate(values)
        ]

    def run(self, values: Sequence[bytes]) -> tuple[list[Sent], list[Sent]]:
        """The batch through the cached pipeline, then through the uncached one."""
        batch = self.batch(values)
        cached, plain = FakeSink(), FakeSink()
        self.cached.handle(batch, cached)  # type: ignore[arg-type]
        self.plain.handle(batch, plain)  # type: ignore[arg-type]
        return cached.sent, plain.sent

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, {"pipeline": "p", **labels})


def _unused_redis() -> Any:
    from worker.config import RedisSettings

    return RedisSettings()  # no redis_ttl_s: never connected


def same_but_cached(cached: Sent, plain: Sent) -> bool:
    """``cached`` is ``plain`` with ``"cached": true``: identical bytes up to the batch's
    timings (each pipeline ran the batch itself), the flag spliced in before them."""
    head, _, _ = plain.value.partition(b',"model":')
    c_head, _, _ = cached.value.partition(b',"model":')
    if c_head.endswith(CACHED):
        c_head = c_head[: -len(CACHED)]
    a, b = orjson.loads(cached.value), orjson.loads(plain.value)
    a.pop("timings_ms", None), b.pop("timings_ms", None), a.pop("cached", None)
    return c_head == head and a == b and cached.key == plain.key and cached.topic == plain.topic


def flags(sent: Sequence[Sent]) -> list[bool | None]:
    return [s.body.get("cached") if s.topic == "res" else None for s in sent]


def test_repeats_skip_the_model_and_publish_the_uncached_bytes(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = WrappedEngine(onnx_engine)
    h = Harness(classifier, store, engine)
    first = [
        req("a", "e0"),
        req("b", "e1"),
        req("c", "e0"),  # a repeat inside the batch
        req("d", features=inline_row(classifier, 5)),
        req("e", "e5"),  # stored features equal to d's inline ones: the same inputs
    ]
    cached, plain = h.run(first)
    assert engine.calls[0] == 3  # e0, e1, row 5 once each
    assert flags(cached) == [None, None, True, None, True]
    assert all(same_but_cached(c, p) for c, p in zip(cached, plain, strict=True))

    second = [req("f", "e1"), req("g", "e2"), req("h", "e0"), req("i", "e0")]
    cached, plain = h.run(second)
    assert engine.calls[2] == 1  # e2 only (calls[1] is the uncached pipeline's batch)
    assert flags(cached) == [True, None, True, True]
    assert all(same_but_cached(c, p) for c, p in zip(cached, plain, strict=True))
    assert h.sample("streamfer_cache_hits_total", tier="batch") == 2
    assert h.sample("streamfer_cache_hits_total", tier="memory") == 3
    assert h.sample("streamfer_cache_hits_total", tier="redis") == 0
    assert h.sample("streamfer_cache_misses_total") == 4
    assert h.sample("streamfer_cache_hit_ratio") == pytest.approx(5 / 9)
    assert h.sample("streamfer_cache_entries") == 4
    assert h.sample("streamfer_results_total") == 9

    schema = validator("result")
    for s in cached:
        assert_valid(schema, s.body)


def test_a_batch_entirely_from_the_cache_never_calls_the_model(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = WrappedEngine(onnx_engine)
    h = Harness(classifier, store, engine)
    h.run([req("a", "e0"), req("b", "e1")])
    calls = len(engine.calls)
    sink = FakeSink()
    h.cached.handle(h.batch([req("c", "e1"), req("d", "e0")]), sink)  # type: ignore[arg-type]
    assert len(engine.calls) == calls
    assert flags(sink.sent) == [True, True]
    assert [s.body["id"] for s in sink.sent] == ["c", "d"]


def test_an_inline_value_over_a_stored_one_is_another_key(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = WrappedEngine(onnx_engine)
    h = Harness(classifier, store, engine)
    stored_f0 = float(classifier.features[0][0])
    values = [
        req("a", "e0"),
        req("b", "e0", {"f0": stored_f0 + 1.0}),  # overrides a stored value
        req("c", "e0", {"f0": stored_f0}),  # overrides it with the stored value itself
    ]
    cached, plain = h.run(values)
    assert engine.calls[0] == 2
    assert flags(cached) == [None, None, True]
    assert all(same_but_cached(c, p) for c, p in zip(cached, plain, strict=True))


def test_non_finite_outputs_are_never_cached(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = NanEngine(onnx_engine)
    h = Harness(classifier, store, engine)
    nan_row = req("n1", features=inline_row(classifier, 3, f0=NAN_ROW))
    for round_ in range(2):
        cached, plain = h.run([nan_row, nan_row, req(f"ok{round_}", "e1")])
        codes = [s.header("streamfer.error_code") for s in cached[:2]]
        assert codes == [b"model_non_finite"] * 2
        assert [s.topic for s in cached] == [s.topic for s in plain] == ["dlq", "dlq", "res"]
    assert len(h.cache.memory) == 1  # e1's row only
    assert h.sample("streamfer_cache_hits_total", tier="memory") == 1
    assert h.sample("streamfer_cache_misses_total") == 5


def test_rows_the_model_fails_on_are_never_cached(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = PoisonEngine(onnx_engine)
    h = Harness(classifier, store, engine)
    poison = req("p", features=inline_row(classifier, 2, f0=POISON))
    cached, plain = h.run([req("a", "e0"), poison, req("b", "e1"), poison])
    assert [s.topic for s in cached] == ["res", "dlq", "res", "dlq"]
    assert [s.header("streamfer.error_code") for s in cached if s.topic == "dlq"] == [
        b"model_error"
    ] * 2
    assert all(
        same_but_cached(c, p) for c, p in zip(cached, plain, strict=True) if c.topic == "res"
    )
    before = len(engine.calls)
    cached, _ = h.run([poison, req("c", "e0")])
    assert engine.calls[before] == 1  # the poison row is tried again, e0 is cached
    assert [s.topic for s in cached] == ["dlq", "res"]
    assert len(h.cache.memory) == 2


def test_evictions_are_counted_and_an_evicted_row_is_computed_again(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = WrappedEngine(onnx_engine)
    h = Harness(classifier, store, engine, max_entries=3)
    h.run([req(f"a{i}", f"e{i}") for i in range(3)])
    assert h.sample("streamfer_cache_evictions_total") == 0
    h.run([req("b", "e3")])  # e0 leaves
    assert h.sample("streamfer_cache_evictions_total") == 1
    cached, _ = h.run([req("c", "e1"), req("d", "e0")])
    assert flags(cached) == [True, None]
    assert h.sample("streamfer_cache_entries") == 3


class SwappedEngine(WrappedEngine):
    """The same model under another SHA-256 once ``swap`` is set (a reload)."""

    swapped = False

    @property
    def model_hash(self) -> str:
        return "f" * 64 if self.swapped else self.inner.model_hash


def test_a_model_changed_between_look_up_and_inference_gets_new_keys(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    engine = SwappedEngine(onnx_engine)
    h = Harness(classifier, store, engine)
    h.run([req("a", "e0")])
    prepared = h.cached.prepare(h.batch([req("b", "e0")]))  # type: ignore[arg-type]
    assert prepared.rows.cached is not None and prepared.rows.cached.found  # a hit, for now
    engine.swapped = True
    scored = h.cached.infer(prepared)
    sink = FakeSink()
    from worker.core.tracker import DeliveryTracker

    h.cached.publish(scored, sink, DeliveryTracker())  # type: ignore[arg-type]
    assert flags(sink.sent) == [None]  # computed by the "new" model
    assert engine.calls[-1] == 1


def test_hooks_and_a_cache_do_not_go_together(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    metrics = Metrics(CollectorRegistry())
    config = pipeline_config(classifier)
    cache = open_cache(config, _unused_redis(), metrics, onnx_engine)
    with pytest.raises(ConfigError, match="hooks"):
        build_pipeline(
            config,
            store=store,
            engine=onnx_engine,
            metrics=metrics.for_pipeline("p"),
            plan=FeedPlan.build(config, onnx_engine.inputs),
            hooks=BatchHooks(prepare=lambda requests, inputs: inputs),
            cache=cache,
        )


def test_off_by_default_and_then_no_cache_series(classifier: DemoModel) -> None:
    metrics = Metrics(CollectorRegistry())
    config = pipeline_config(classifier).model_copy(update={"cache": CacheSpec()})
    assert config.cache.enabled is False
    assert open_cache(config, _unused_redis(), metrics, object()) is None  # type: ignore[arg-type]
    text = metrics.registry.get_sample_value("streamfer_cache_misses_total", {"pipeline": "p"})
    assert text is None


# --- configuration ----------------------------------------------------------------------


def raw_config(model_path: Path, **overrides: Any) -> dict[str, Any]:
    pipeline: dict[str, Any] = {
        "name": "p",
        "request_topics": ["req"],
        "result_topic": "res",
        "dead_letter_topic": "dlq",
        "features": {"fields": ["a", "b"]},
        "model": {"path": str(model_path), "name": "m"},
    }
    for key, value in overrides.items():
        pipeline[key] = {**pipeline.get(key, {}), **value}
    return {"pipelines": [pipeline]}


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    return path


def test_a_cache_for_a_non_deterministic_model_is_refused_naming_both_fields(
    model_file: Path,
) -> None:
    raw = raw_config(model_file, cache={"enabled": True}, model={"deterministic": False})
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ={})
    message = str(info.value)
    assert "pipelines[0]" in message
    assert "cache.enabled = true" in message and "model.deterministic = false" in message
    # either alone is fine
    parse_config(raw_config(model_file, model={"deterministic": False}), environ={})
    parse_config(raw_config(model_file, cache={"enabled": True}), environ={})


def test_a_cache_with_hooks_is_refused(model_file: Path) -> None:
    raw = raw_config(model_file, cache={"enabled": True}, hooks={"postprocess": "m:f"})
    with pytest.raises(ConfigError, match=r"cache\.enabled = true with hooks\.postprocess"):
        parse_config(raw, environ={})


def test_a_cache_with_nowhere_to_keep_anything_is_refused(model_file: Path) -> None:
    raw = raw_config(model_file, cache={"enabled": True, "max_entries": 0})
    with pytest.raises(ConfigError, match=r"cache\.max_entries = 0 and no cache\.redis_ttl_s"):
        parse_config(raw, environ={})
    parse_config(
        raw_config(model_file, cache={"enabled": True, "max_entries": 0, "redis_ttl_s": 60}),
        environ={},
    )


@pytest.mark.parametrize(
    ("cache", "field"),
    [
        ({"max_entries": -1}, "cache.max_entries"),
        ({"redis_ttl_s": 0}, "cache.redis_ttl_s"),
        ({"redis_timeout_ms": 0}, "cache.redis_timeout_ms"),
        ({"redis_key_prefix": ""}, "cache.redis_key_prefix"),
        ({"size": 10}, "cache.size"),
    ],
)
def test_bad_cache_values_name_the_field(
    model_file: Path, cache: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=rf"pipelines\[0\]\.{field}"):
        parse_config(raw_config(model_file, cache=cache), environ={})


def test_streamfer_run_exits_2_for_a_cached_non_deterministic_model(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(
        f"""
[[pipelines]]
name = "p"
request_topics = ["req"]
result_topic = "res"
dead_letter_topic = "dlq"

[pipelines.features]
fields = ["a"]

[pipelines.model]
path = "{model_file}"
name = "m"
deterministic = false

[pipelines.cache]
enabled = true
"""
    )
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cache.enabled" in err and "model.deterministic" in err


def test_an_entry_costs_its_bytes_not_an_encoder_buffer(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    """orjson hands back its output in a 4 KiB buffer: kept as it is, 100,000 entries
    would hold 400 MB instead of about 30."""
    import tracemalloc

    import numpy as np

    h = Harness(classifier, store, onnx_engine)
    name = onnx_engine.inputs[0].name
    feeds = {name: np.random.default_rng(3).standard_normal((2000, 30)).astype(np.float32)}
    outputs = onnx_engine.infer(feeds)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rows = h.cache.look_up(feeds, onnx_engine)
        plan = h.cache.to_run(rows, feeds, onnx_engine)
        h.cache.settle(plan, outputs, {})
        rows = plan = None  # only the cache's entries are left
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(h.cache.memory) == 2000
    assert held / 2000 < 600, f"{held / 2000:.0f} bytes per entry"


# --- the byte bound -----------------------------------------------------------------------


def row_cost(sent: Sent) -> int:
    """What a result's row counts against max_bytes: its key, its encoded outputs (the
    bytes the result embeds) and the tier's cost per entry."""
    return KEY_BYTES + len(orjson.dumps(sent.body["outputs"])) + ENTRY_OVERHEAD


def test_the_bytes_gauge_counts_what_the_entries_take(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    h = Harness(classifier, store, onnx_engine)
    cached, _ = h.run([req(f"a{i}", f"e{i}") for i in range(6)])
    assert h.sample("streamfer_cache_entries") == 6
    assert h.sample("streamfer_cache_bytes") == h.cache.memory.nbytes
    assert h.cache.memory.nbytes == sum(row_cost(s) for s in cached)


@pytest.mark.parametrize(("slack", "kept"), [(0, True), (1, True), (-1, False)])
def test_a_row_just_under_or_at_max_bytes_is_kept_and_one_byte_over_is_not(
    classifier: DemoModel,
    store: MemoryStore,
    onnx_engine: OnnxEngine,
    slack: int,
    kept: bool,
) -> None:
    probe = Harness(classifier, store, onnx_engine)
    (first,), _ = probe.run([req("a", "e0")])
    engine = WrappedEngine(onnx_engine)
    h = Harness(classifier, store, engine, max_bytes=row_cost(first) + slack)
    h.run([req("a", "e0")])
    cached, plain = h.run([req("b", "e0")])  # no error either way, the same result
    assert flags(cached) == [True if kept else None]
    assert same_but_cached(cached[0], plain[0])
    assert h.sample("streamfer_cache_entries") == int(kept)
    assert h.sample("streamfer_cache_bytes") == (row_cost(first) if kept else 0)
    assert h.sample("streamfer_cache_evictions_total") == 0


def test_bytes_over_max_bytes_evict_the_least_recently_used_rows(
    classifier: DemoModel, store: MemoryStore, onnx_engine: OnnxEngine
) -> None:
    probe = Harness(classifier, store, onnx_engine)
    sent, _ = probe.run([req(f"a{i}", f"e{i}") for i in range(4)])
    three = sum(row_cost(s) for s in sent[1:4])
    h = Harness(classifier, store, onnx_engine, max_bytes=three)
    h.run([req(f"a{i}", f"e{i}") for i in range(4)])  # e0 leaves for the other three
    assert h.sample("streamfer_cache_evictions_total") == 1
    assert h.sample("streamfer_cache_bytes") == three
    cached, _ = h.run([req("b1", "e1"), req("b0", "e0")])
    assert flags(cached) == [True, None]


def test_max_bytes_zero_without_redis_is_refused(model_file: Path) -> None:
    raw = raw_config(model_file, cache={"enabled": True, "max_bytes": 0})
    with pytest.raises(ConfigError, match=r"cache\.max_bytes = 0 and no cache\.redis_ttl_s"):
        parse_config(raw, environ={})
    assert CacheSpec().max_bytes == 256 * 2**20

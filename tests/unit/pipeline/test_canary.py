"""The canary: a stable share of keys scored by a candidate model, in one batch with the
rest, at most two engine calls per batch, each result naming the model that scored it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tests.fakes.onnx_models import random_mlp, three_feature_pipeline
from tests.fakes.pipeline import FakeMessage, WrappedEngine
from tests.fakes.sink import FakeSink
from worker.compose import Metrics
from worker.config import ModelSpec
from worker.core.tracker import DeliveryTracker
from worker.errors import EngineError
from worker.inference.engine import Feeds, OnnxEngine, Outputs
from worker.inference.slot import LiveModel, ModelSlot
from worker.models import build_pipeline
from worker.pipeline.canary import BUCKETS, Canary, canary_bucket, canary_mask
from worker.pipeline.feeds import FeedPlan
from worker.pipeline.steps import Pipeline

if TYPE_CHECKING:
    from tests.fakes.stores import StoreFactory

FIELDS = ["a", "b", "c"]


def _expected_bucket(key: bytes) -> int:
    """The documented rule, written out independently."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 10_000


def test_the_bucket_is_blake2b_of_the_key_modulo_ten_thousand() -> None:
    for key in (b"", b"k1", b"user-42", "ünïcode".encode(), bytes(range(256))):
        assert canary_bucket(key) == _expected_bucket(key)
    assert BUCKETS == 10_000


def test_the_mask_takes_the_keys_below_percent_of_the_buckets() -> None:
    keys = [f"k{i}".encode() for i in range(20_000)]
    ids = [f"r{i}" for i in range(20_000)]
    mask = canary_mask(keys, ids, 10)
    expected = np.array([_expected_bucket(k) < 1000 for k in keys])
    assert (mask == expected).all()
    assert 0.09 < mask.mean() < 0.11
    # stable: the same keys, another batch, another order, the same answer per key
    again = canary_mask(keys[::-1], ids[::-1], 10)
    assert (again[::-1] == mask).all()
    # a larger share keeps every key the smaller one had
    wider = canary_mask(keys, ids, 25)
    assert (wider | ~mask).all() and 0.24 < wider.mean() < 0.26


def test_a_record_without_a_key_is_split_by_its_request_id() -> None:
    ids = [f"request-{i}" for i in range(2000)]
    mask = canary_mask([None] * len(ids), ids, 50)
    assert list(mask) == [_expected_bucket(i.encode()) < 5000 for i in ids]


@pytest.mark.parametrize("percent", [0.01, 100])
def test_the_edges_of_percent(percent: float) -> None:
    keys = [f"k{i}".encode() for i in range(5000)]
    mask = canary_mask(keys, [""] * len(keys), percent)
    assert list(mask) == [_expected_bucket(k) < percent * 100 for k in keys]


def test_just_over_one_bucket_takes_exactly_the_keys_of_bucket_zero() -> None:
    keys = [f"k{i}".encode() for i in range(50_000)]
    mask = canary_mask(keys, [""] * len(keys), 0.0101)
    assert list(mask) == [_expected_bucket(k) == 0 for k in keys]
    assert mask.any()  # about 5 of 50,000


@pytest.mark.parametrize("percent", [0, -1, 100.5, 0.0099])
def test_a_percent_out_of_range_is_refused(percent: float, tmp_path: Path) -> None:
    spec = ModelSpec(path=random_mlp(tmp_path / "m.onnx"), name="m")
    with pytest.raises(ValueError, match="percent"):
        Canary(ModelSlot(LiveModel.of(spec, OnnxEngine(spec))), percent)


# --- in a pipeline ----------------------------------------------------------------------


class Counting(WrappedEngine):
    """Counts the rows of each call; refuses any batch holding a row with a == -999."""

    def infer(self, feeds: Feeds) -> Outputs:
        (only,) = feeds.values()
        self.calls.append(len(only))
        if (only[:, 0] == -999).any():
            raise EngineError("poison row")
        return self.inner.infer(feeds)


@pytest.fixture
def versions(tmp_path: Path) -> dict[str, Path]:
    return {v: random_mlp(tmp_path / v / "model.onnx", seed=int(v)) for v in ("1", "2")}


def _pipeline(
    versions: dict[str, Path], make_store: StoreFactory, percent: float
) -> tuple[Pipeline, Counting, Counting, Metrics]:
    config = three_feature_pipeline(versions["1"])
    data = {
        f"e{i}": {f: repr(float(i % 7 - 3) + j / 4).encode() for j, f in enumerate(FIELDS)}
        for i in range(40)
    }
    data["poison"] = {"a": b"-999", "b": b"0", "c": b"0"}
    primary = Counting(OnnxEngine(config.model))
    spec = config.model.model_copy(update={"path": versions["2"], "version": "2"})
    candidate = Counting(OnnxEngine(spec))
    metrics = Metrics(CollectorRegistry())
    pipeline = build_pipeline(
        config,
        store=make_store(data, FIELDS),
        engine=primary,
        plan=FeedPlan.build(config, primary.inputs),
        metrics=metrics.for_pipeline("p"),
        canary=Canary(ModelSlot(LiveModel.of(spec, candidate)), percent),
    )
    return pipeline, primary, candidate, metrics


def _messages(n: int, *, poison: frozenset[int] = frozenset()) -> list[Any]:
    return [
        FakeMessage(
            f'{{"id": "r{i}", "entity": "{"poison" if i in poison else f"e{i % 40}"}"}}'.encode(),
            i,
            key=f"key-{i}".encode(),
        )
        for i in range(n)
    ]


def test_the_canary_scores_its_keys_and_names_itself(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    pipeline, primary, candidate, metrics = _pipeline(versions, make_store, 30)
    sink = FakeSink()
    batch = _messages(64)
    pipeline.publish(pipeline.infer(pipeline.prepare(batch)), sink, DeliveryTracker())
    chosen = {f"r{i}" for i in range(64) if _expected_bucket(f"key-{i}".encode()) < 3000}
    assert 0 < len(chosen) < 64
    assert primary.calls == [64 - len(chosen)] and candidate.calls == [len(chosen)]
    results = [s.body for s in sink.to("res")]
    assert [r["id"] for r in results] == [f"r{i}" for i in range(64)]  # in batch order
    one = OnnxEngine(ModelSpec(path=versions["1"], name="x"))
    two = OnnxEngine(ModelSpec(path=versions["2"], name="x"))
    rows = np.array(
        [[float(i % 40 % 7 - 3) + j / 4 for j in range(3)] for i in range(64)], dtype=np.float32
    )
    for i, r in enumerate(results):
        version = "2" if r["id"] in chosen else "1"
        engine = two if version == "2" else one
        assert r["model"] == {"name": "m", "version": version}
        expected = engine.infer(rows[i : i + 1])["probabilities"][0]
        np.testing.assert_allclose(r["outputs"]["probabilities"], expected, rtol=1e-6)
    counted = metrics.registry.get_sample_value("streamfer_canary_records_total", {"pipeline": "p"})
    assert counted == len(chosen)


def test_a_batch_with_no_canary_key_makes_one_call(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    pipeline, primary, candidate, _ = _pipeline(versions, make_store, 0.01)
    batch = [m for m in _messages(200) if _expected_bucket(m.key()) >= 1][:50]
    prepared = pipeline.infer(pipeline.prepare(batch))
    assert prepared.rows.canary is None and prepared.candidate is None
    assert (primary.calls, candidate.calls) == ([50], [])


def test_a_failing_row_of_either_model_is_isolated_and_named(
    versions: dict[str, Path], make_store: StoreFactory
) -> None:
    pipeline, _primary, _candidate, _ = _pipeline(versions, make_store, 50)
    canary_rows = [i for i in range(40) if _expected_bucket(f"key-{i}".encode()) < 5000]
    other_rows = [i for i in range(40) if i not in canary_rows]
    poison = frozenset({canary_rows[0], other_rows[0]})
    sink = FakeSink()
    batch = _messages(40, poison=poison)
    pipeline.publish(pipeline.infer(pipeline.prepare(batch)), sink, DeliveryTracker())
    dead = {d.body["request_id"]: d.body for d in sink.to("dlq")}
    assert set(dead) == {f"r{i}" for i in poison}
    assert dead[f"r{canary_rows[0]}"]["model"] == "m:2"
    assert dead[f"r{other_rows[0]}"]["model"] == "m:1"
    assert len(sink.to("res")) == 38

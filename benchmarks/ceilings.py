"""In-process ceilings: ONNX Runtime alone, and Redis pipelined HMGET alone.

``ort_alone`` times one model call per batch at batch sizes 1, 2, 4 ... 1024 on rows of
the data set (the session configured as streamfer's), and reports rows/s and per-call
percentiles at each size; rows/s is batch size over the median call time (so a busy
machine's outliers do not set the ceiling), with the mean-based figure beside it.
``redis_alone`` times the worker's own fetch, one pipelined round trip
(``RedisHashStore.get_many``: HMGET per entity, raw values; or, for the packed layout,
``RedisPackedStore.fetch``: one MGET, decoded) over batches of 256 distinct entities
drawn from the seeded ones, plus the same fetch followed by ``worker.pipeline.feeds.assemble``
(the worker's whole enrich stage, ending in the model's float32 input). Neither touches Kafka.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import redis

from benchmarks.session import load_session
from streamfer_dev.harness import percentile
from worker.config import FeatureSpec, ModelSpec, PipelineConfig
from worker.core import DecodedRequests
from worker.features import OneStore, RedisHashStore, RedisPackedStore
from worker.inference import TensorInput
from worker.pipeline import FeedPlan, assemble

__all__ = ["BATCH_SIZES", "ort_alone", "redis_alone"]

BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _timed(calls: int, budget_s: float, fn: Any) -> list[float]:
    """Milliseconds per call: at least 5 calls, then up to ``calls`` within ``budget_s``."""
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < calls and (len(times) < 5 or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def _stats(times_ms: Sequence[float], rows: int) -> dict[str, float]:
    """Rows/s from the median call (robust to a busy machine), and from the mean."""
    mean = sum(times_ms) / len(times_ms)
    median = percentile(times_ms, 50)
    return {
        "batch": rows,
        "calls": len(times_ms),
        "rps": round(rows / (median / 1000.0), 1),
        "rps_mean": round(rows / (mean / 1000.0), 1),
        "mean_ms": round(mean, 3),
        "p50_ms": round(percentile(times_ms, 50), 3),
        "p95_ms": round(percentile(times_ms, 95), 3),
        "p99_ms": round(percentile(times_ms, 99), 3),
    }


def ort_alone(
    model_path: str,
    features: npt.NDArray[np.float32],
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    budget_s: float = 0.4,
    max_calls: int = 300,
) -> list[dict[str, float]]:
    """Per batch size: rows/s and per-call latency of one session.run."""
    session, input_name = load_session(model_path)
    out = []
    for size in batch_sizes:
        batch = np.ascontiguousarray(np.resize(features, (size, features.shape[1])))
        session.run(None, {input_name: batch})  # warm-up, as the worker does
        times = _timed(max_calls, budget_s, lambda b=batch: session.run(None, {input_name: b}))
        out.append(_stats(times, size))
    return out


def redis_alone(
    redis_url: str,
    spec: FeatureSpec,
    entities: Sequence[str],
    *,
    batch_size: int = 256,
    batches: int = 40,
    seed: int = 11,
) -> dict[str, dict[str, float]]:
    """The store's fetch alone, and fetch + ``assemble``, over batches of distinct entities.

    For the ``hash`` layout the fetch is ``RedisHashStore.get_many`` (the pipelined HMGETs,
    raw values); for ``packed`` it is ``RedisPackedStore.fetch`` (one MGET, decoded).
    """
    client = redis.Redis.from_url(redis_url)
    rng = random.Random(seed)
    size = min(batch_size, len(entities))
    samples = [rng.sample(list(entities), size) for _ in range(batches)]
    fetch_one: Any
    store: Any
    if spec.layout == "packed":
        store = RedisPackedStore(client, spec)
        fetch_one = store.fetch
    else:
        store = RedisHashStore(client, spec)
        fetch_one = store.get_many
    fetch_one(samples[0])  # connect
    try:
        it = iter(samples * 2)
        fetch = _timed(batches, 10.0, lambda: fetch_one(next(it)))
        plan = _one_matrix_plan(spec)
        lookups = OneStore("entity", store)
        decoded = [
            DecodedRequests(list(range(size)), [""] * size, {"entity": list(sample)}, [None] * size)
            for sample in samples
        ]
        it = iter(decoded * 2)
        enrich = _timed(batches, 10.0, lambda: assemble(plan, next(it), lookups))
    finally:
        store.close()
    return {"fetch": _stats(fetch, size), "assemble": _stats(enrich, size)}


def _one_matrix_plan(spec: FeatureSpec) -> FeedPlan:
    """The plan of a pipeline with one lookup and a model taking one float32 matrix."""
    config = PipelineConfig(
        name="ceiling",
        request_topics=["r"],
        result_topic="o",
        dead_letter_topic="d",
        features=spec,
        model=ModelSpec(path=Path("model.onnx"), name="m"),
    )
    matrix = TensorInput("input", "tensor(float)", np.dtype(np.float32), 2, len(spec.fields))
    return FeedPlan.build(config, [matrix])

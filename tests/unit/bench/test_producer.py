"""The benchmark producer's streams: entities only, or a share repeating a few inputs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import orjson

from benchmarks.producer import requests


def docs(n: int, **kw: object) -> list[dict[str, object]]:
    return [orjson.loads(v) for _tag, _key, v in requests(n, "e-", 569, **kw)]  # type: ignore[arg-type]


def test_by_default_a_request_names_an_entity_only() -> None:
    out = docs(50)
    assert all(set(d) == {"id", "entity"} for d in out)
    assert [d["id"] for d in out] == [f"r{i}" for i in range(50)]


def test_a_share_of_the_requests_repeats_a_few_distinct_inputs() -> None:
    n = 20_000
    out = docs(n, repeat_share=0.9, distinct=1000, feature="f0")
    inputs = [(d["entity"], d["features"]["f0"]) for d in out]  # type: ignore[index]
    hot = [i for i in inputs if i[1] < 30]
    assert abs(len(hot) / n - 0.9) < 0.01
    assert len(set(hot)) == 1000
    cold = [i for i in inputs if i[1] >= 30]
    assert len(set(cold)) == len(cold)  # never sent twice
    # every inline value is exactly a float32, so the model sees what was sent
    values = np.array([v for _e, v in inputs])
    assert (values.astype(np.float32).astype(np.float64) == values).all()
    repeats = sum(c - 1 for c in Counter(inputs).values())
    assert repeats == n - len(set(inputs))


def test_no_share_means_every_input_is_new() -> None:
    out = docs(2000, repeat_share=0.0)
    inputs = {(d["entity"], d["features"]["f0"]) for d in out}  # type: ignore[index]
    assert len(inputs) == 2000

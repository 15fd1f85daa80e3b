"""The output cache end to end: real Kafka, real Redis, ``streamfer run`` processes.

The model is the scikit-learn ColumnTransformer pipeline exported by skl2onnx's
defaults (``tests.integration.recipes.sklearn_pipeline``: a float input and a string
input, ZipMap scores, class names), fed from two lookups (a user hash holding strings,
a merchant's packed vector) and inline numbers, some requests overriding a stored string
inline. Every published result is compared, exactly, with ONNX Runtime run here on the
same row; the worker's own ``/metrics`` must count what the stream repeated.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis

from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    produce_requests,
    wait_for_assignment,
)
from streamfer_dev.stack import RedisCluster, free_port, start_redis_cluster
from tests.conftest import Topics
from tests.integration.helpers import assert_valid, eventually, scrape_metrics, validator
from tests.integration.recipes import (
    CATEGORICAL,
    NUMERIC,
    FraudData,
    Recipe,
    fraud_data,
    fraud_lookup_tables,
)
from tests.integration.recipes import sklearn_pipeline as make_recipe
from worker.features.stores import pack_vector

pytestmark = pytest.mark.integration

CLASS_NAMES = ["legit", "fraud"]
PARTITIONS = 3

Row = dict[str, Any]
"""A request's seven features by name, as the model sees them."""


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(200, n_users=12, n_merchants=6, seed=11)


@pytest.fixture(scope="module")
def recipe(data: FraudData, tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return make_recipe(tmp_path_factory.mktemp("cache-model"), data)


@pytest.fixture(scope="module")
def session(recipe: Recipe) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(recipe.model_path), providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class Stored:
    """Where one test's features live: a fresh key prefix in the shared Redis."""

    tag: str
    url: str
    cluster: bool = False


def store(url: str, data: FraudData, cluster: bool = False) -> Stored:
    tag = f"oc-{uuid.uuid4().hex[:8]}"
    client: Any = (redis.RedisCluster if cluster else redis.Redis).from_url(url)
    pipe = client.pipeline(transaction=False)
    for uid, feats in data.users.items():
        pipe.hset(f"{tag}:user:{uid}", mapping={k: str(v) for k, v in feats.items()})
    for mid, feats in data.merchants.items():
        pipe.set(f"{tag}:merchant:{mid}", pack_vector([feats["risk"], feats["volume_30d"]]))
    pipe.execute()
    client.close()
    return Stored(tag, url, cluster)


def config(
    path: Path,
    *,
    bootstrap: str,
    stored: Stored,
    topics: Topics,
    recipe: Recipe,
    cache: str,
    metrics_port: int,
    lookups: bool = True,
) -> Path:
    """A worker config serving ``recipe`` with ``[pipelines.cache]`` holding ``cache``."""
    inputs = "\n".join(f"{n} = {orjson.dumps(c).decode()}" for n, c in recipe.inputs.items())
    outputs = "\n".join(f"{f} = {orjson.dumps(o).decode()}" for f, o in recipe.outputs.items())
    tables = fraud_lookup_tables(stored.tag) if lookups else ""
    path.write_text(
        f"""
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{topics.group}"
session_timeout_ms = 10000

[redis]
url = "{stored.url}"
cluster = {"true" if stored.cluster else "false"}
socket_timeout_s = 2

[metrics]
host = "127.0.0.1"
port = {metrics_port}

[[pipelines]]
name = "fraud"
request_topics = ["{topics.requests}"]
result_topic = "{topics.results}"
dead_letter_topic = "{topics.dead_letters}"

[pipelines.batch]
max_batch_size = 32
max_wait_ms = 10

[pipelines.request]
id = "meta.request_id"
{tables}
[pipelines.model]
path = "{recipe.model_path}"
name = "{recipe.name}"
class_names = {orjson.dumps(CLASS_NAMES).decode()}

[pipelines.model.inputs]
{inputs}

[pipelines.model.outputs]
{outputs}

[pipelines.cache]
enabled = true
{cache}
"""
    )
    return path


@dataclass(frozen=True)
class Request:
    """One request: its JSON and the row the model sees for it."""

    rid: str
    doc: dict[str, Any]
    row: Row

    def again(self, rid: str) -> Request:
        """The same request under another id."""
        return Request(rid, {**self.doc, "meta": {"request_id": rid}}, self.row)


def request(
    data: FraudData, rid: str, i: int, *, inline_all: bool = False, **inline: Any
) -> Request:
    """Request ``i`` of ``data`` (its user's and merchant's features from Redis, its
    amount and hour inline), with ``inline`` values over the stored ones; ``inline_all``
    carries all seven features inline and names no entity."""
    req = data.requests[i]
    row: Row = {**data.rows()[i], **inline}
    features = dict(row) if inline_all else {"amount": req["amount"], "hour": req["hour"], **inline}
    doc: dict[str, Any] = {"meta": {"request_id": rid}, "features": features}
    if not inline_all:
        doc["user"] = {"id": req["user"]}
        doc["merchant_id"] = req["merchant"]
    return Request(rid, doc, row)


def row_key(row: Row) -> tuple[Any, ...]:
    """A row as the model sees it: float32 numbers, then strings."""
    return (*(float(np.float32(row[c])) for c in NUMERIC), *(str(row[c]) for c in CATEGORICAL))


def expected_outputs(session: Any, rows: Sequence[Row]) -> list[dict[str, Any]]:
    """ONNX Runtime's own answer for each row, as a result publishes it: the label by
    class name, the ZipMap scores in class order; all rows in one call."""
    numeric = np.array([[row[c] for c in NUMERIC] for row in rows], dtype=np.float32)
    categorical = np.array([[str(row[c]) for c in CATEGORICAL] for row in rows], dtype=object)
    labels, scores = session.run(
        ["output_label", "output_probability"],
        {
            "numeric": numeric.reshape(len(rows), -1),
            "categorical": categorical.reshape(len(rows), -1),
        },
    )
    return [
        {
            "label": CLASS_NAMES[int(label)],
            "scores": [float(np.float32(s[0])), float(np.float32(s[1]))],
        }
        for label, s in zip(labels.tolist(), scores, strict=True)
    ]


def assert_exact(session: Any, requests: Sequence[Request], got: dict[str, Any]) -> None:
    """Each result's outputs are ONNX Runtime's on the request's row, exactly, and all
    results of one row are the same.

    Exactly which of two answers: on this CPU, Runtime's one-row call of this model
    differs from a call of several rows in the last float32 bit for about a third of
    the rows (a one-row product takes another kernel), so a worker's answer for a row
    already depends on the size of the call it ran in, cache or not: each result must be
    one of the two, bit for bit, and the cache must hand every repeat the same one."""
    distinct = list({row_key(r.row): r.row for r in requests}.items())
    batched = expected_outputs(session, [row for _, row in distinct] * 2)
    answers = {
        key: (expected_outputs(session, [row])[0], batched[i])
        for i, (key, row) in enumerate(distinct)
    }
    schema = validator("result")
    published: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in requests:
        doc = got[r.rid]
        assert_valid(schema, doc)
        key = row_key(r.row)
        assert doc["outputs"] in answers[key], (r.rid, doc["outputs"], answers[key])
        assert published.setdefault(key, doc["outputs"]) == doc["outputs"], r.rid


def all_from_cache(
    served: Served, session: Any, rows: Sequence[Request], earlier: dict[str, Any], tag: str
) -> int:
    """Send ``rows`` again under new ids: every result must come from the cache with the
    outputs ``earlier`` published. Returns how many were sent."""
    again = [r.again(f"{tag}-{r.rid}") for r in rows]
    got = served.round_trip(again)
    assert_exact(session, again, got)
    assert cached_ids(got) == {r.rid for r in again}
    for r in rows:
        assert got[f"{tag}-{r.rid}"]["outputs"] == earlier[r.rid]["outputs"]
    return len(again)


def cached_ids(got: dict[str, Any]) -> set[str]:
    flags = {d.get("cached") for d in got.values()}
    assert flags <= {None, True}, flags  # uncached results carry no flag at all
    return {rid for rid, d in got.items() if d.get("cached") is True}


class Counters:
    """The cache's series on a worker's /metrics."""

    def __init__(self, port: int) -> None:
        self.samples = scrape_metrics(port)

    def get(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"pipeline": "fraud", **labels}.items())))
        return self.samples.get(key, 0.0)

    def hits(self, tier: str | None = None) -> float:
        tiers = [tier] if tier else ["memory", "redis", "batch"]
        return sum(self.get("streamfer_cache_hits_total", tier=t) for t in tiers)


@dataclass
class Served:
    """A running worker: its topics, its /metrics port, its process."""

    topics: Topics
    port: int
    worker: WorkerProcess
    bootstrap: str

    def send(self, requests: Sequence[Request]) -> None:
        produce_requests(
            self.bootstrap,
            self.topics.requests,
            [(r.rid, r.rid.encode(), orjson.dumps(r.doc)) for r in requests],
        )

    def results(self, requests: Sequence[Request]) -> dict[str, Any]:
        """Every request's result (none may be missing, repeated or dead-lettered)."""
        ids = {r.rid for r in requests}
        t = self.topics
        out: Outcomes = collect_outcomes(
            self.bootstrap, t.results, t.dead_letters, ids, timeout=90, keep_docs=True
        )
        assert out.lost(ids) == []
        assert out.dead_letter_docs == []
        assert out.duplicates() == 0
        return {d["id"]: d for d in out.result_docs if d["id"] in ids}

    def round_trip(self, requests: Sequence[Request]) -> dict[str, Any]:
        self.send(requests)
        return self.results(requests)

    def counters(self) -> Counters:
        return Counters(self.port)


@pytest.fixture
def serve(
    recipe: Recipe,
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> Iterator[Callable[..., Served]]:
    """Factory: a worker serving the recipe from ``stored`` with ``[pipelines.cache]``
    holding ``cache``, on fresh topics and group; each is stopped by PID at the end."""
    started: list[WorkerProcess] = []

    def start(stored: Stored, cache: str, *, lookups: bool = True) -> Served:
        n = len(started)
        topics, port = fresh_topics(PARTITIONS), free_port()
        path = config(
            tmp_path / f"worker-{n}.toml",
            bootstrap=kafka_bootstrap,
            stored=stored,
            topics=topics,
            recipe=recipe,
            cache=cache,
            metrics_port=port,
            lookups=lookups,
        )
        worker = WorkerProcess(path, tmp_path / f"worker-{n}.log").start()
        started.append(worker)
        wait_for_assignment([worker], PARTITIONS, timeout=90)
        return Served(topics, port, worker, kafka_bootstrap)

    yield start
    for worker in started:
        worker.terminate()


def keys_under(client: Any, prefix: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{prefix}*", count=1000))


def stored_keys(client: Any, prefix: str, count: int, timeout: float = 10.0) -> list[bytes]:
    """The keys under ``prefix`` once there are ``count`` (or what there is at
    ``timeout``): the worker writes its entries after handing the batch's results to
    the producer, so a reader can see the results first."""
    eventually(lambda: len(keys_under(client, prefix)) >= count, timeout)
    return keys_under(client, prefix)


def redis_tier(stored: Stored, *, ttl: int, memory: bool = True) -> tuple[str, str]:
    """A fresh key prefix, and the cache table that keeps entries there for ``ttl`` s."""
    prefix = f"{stored.tag}:cache:"
    # a generous timeout: these tests are about what is cached, not how fast on a
    # loaded machine (a round trip over it counts as an error and misses)
    lines = [f"redis_ttl_s = {ttl}", f'redis_key_prefix = "{prefix}"', "redis_timeout_ms = 2000"]
    if not memory:
        lines.append("max_entries = 0")
    return prefix, "\n".join(lines)


# --- one worker, the in-process tier ---------------------------------------------------


def test_repeats_are_served_from_the_cache_and_equal_the_model_exactly(
    data: FraudData,
    session: Any,
    redis_url: str,
    serve: Callable[..., Served],
) -> None:
    served = serve(store(redis_url, data), "max_entries = 1000")
    # 40 distinct requests, two near twins of the first (one float32 step in a number,
    # a stored string overridden inline), then 90% of a 500-request stream repeating them
    base = [request(data, f"d{i}", i) for i in range(40)]
    amount = np.float32(data.requests[0]["amount"])
    nudged = float(np.nextafter(amount, np.float32(np.inf)))
    other_country = "JP" if base[0].row["country"] != "JP" else "BR"
    twins = [
        request(data, "twin-amount", 0, amount=nudged),
        request(data, "twin-country", 0, country=other_country),
    ]
    rng = np.random.default_rng(5)
    stream = [*base, *twins]
    for n in range(500):
        if rng.random() < 0.9:
            src = (base + twins)[int(rng.integers(len(base) + len(twins)))]
            stream.append(src.again(f"rep{n}-{src.rid}"))
        else:
            i = 40 + int(rng.integers(160))
            stream.append(request(data, f"new{n}-{i}", i))
    stream = [stream[i] for i in rng.permutation(len(stream))]
    got = served.round_trip(stream)

    assert_exact(session, stream, got)
    distinct = {row_key(r.row) for r in stream}
    assert len(distinct) < len(stream) * 0.35  # the stream did repeat itself
    # the twins are rows of their own: a cache that took them for d0 would count more hits
    assert len({row_key(base[0].row), *(row_key(t.row) for t in twins)}) == 3
    cached = cached_ids(got)
    # each distinct row ran the model once, whichever of its requests came first
    assert len(cached) == len(stream) - len(distinct)

    counters = served.counters()
    assert counters.hits() == len(cached)
    assert counters.hits("redis") == 0
    assert counters.get("streamfer_cache_misses_total") == len(distinct)
    assert counters.get("streamfer_cache_entries") == len(distinct)
    assert counters.get("streamfer_cache_evictions_total") == 0
    assert counters.get("streamfer_cache_errors_total", kind="redis") == 0
    assert 0 < counters.get("streamfer_cache_hit_ratio") <= 1


MAX_BYTES = 4096
"""Room for about 15 of the recipe's rows (16-byte key, 176 bytes of overhead, the
outputs' JSON)."""


def test_the_byte_bound_holds_and_its_bytes_are_exported(
    data: FraudData,
    session: Any,
    redis_url: str,
    serve: Callable[..., Served],
) -> None:
    """40 distinct rows through a tier bounded at 4 KiB: what /metrics shows as held is
    at most the bound and at least the bound less one row, and exactly what the rows
    left take as the tier counts them; every result stays exact."""
    served = serve(store(redis_url, data), f"max_entries = 1000\nmax_bytes = {MAX_BYTES}")
    stream = [request(data, f"d{i}", i) for i in range(40)]
    got = served.round_trip(stream)
    assert_exact(session, stream, got)
    assert not cached_ids(got)
    costs = {16 + len(orjson.dumps(doc["outputs"])) + 176 for doc in got.values()}
    counters = served.counters()
    entries = counters.get("streamfer_cache_entries")
    held = counters.get("streamfer_cache_bytes")
    assert 0 < entries < 40
    assert MAX_BYTES - max(costs) < held <= MAX_BYTES
    assert entries * min(costs) <= held <= entries * max(costs)
    assert counters.get("streamfer_cache_evictions_total") == 40 - entries
    assert counters.get("streamfer_cache_misses_total") == 40


# --- the shared Redis tier -------------------------------------------------------------


def test_a_second_worker_gets_redis_hits_for_what_the_first_computed(
    data: FraudData,
    session: Any,
    redis_url: str,
    serve: Callable[..., Served],
) -> None:
    stored = store(redis_url, data)
    prefix, cache = redis_tier(stored, ttl=120)
    first = serve(stored, cache)
    computed = [
        request(data, f"a{i}", i, **({"country": "JP"} if i % 7 == 0 else {})) for i in range(60)
    ]
    assert len({row_key(r.row) for r in computed}) == len(computed)
    got = first.round_trip(computed)
    assert_exact(session, computed, got)
    assert cached_ids(got) == set()

    client = redis.Redis.from_url(redis_url)
    try:
        keys = stored_keys(client, prefix, len(computed))
        assert len(keys) == len(computed)
        ttls = [client.ttl(k) for k in keys]
        assert all(0 < t <= 120 for t in ttls), ttls
        assert all(v.startswith(b"sfc1:{") for v in client.mget(keys))
    finally:
        client.close()

    # another process, another group and topics, the same model and Redis, started
    # while the first still runs: its memory is empty, Redis has every row
    second = serve(stored, cache)
    sent = all_from_cache(second, session, computed, got, "b")
    b = second.counters()
    assert b.hits("redis") == sent
    assert b.hits("memory") == b.hits("batch") == 0
    assert b.get("streamfer_cache_misses_total") == 0
    a = first.counters()
    assert a.hits() == 0 and a.get("streamfer_cache_misses_total") == len(computed)


def test_redis_entries_expire_after_their_ttl(
    data: FraudData,
    session: Any,
    redis_url: str,
    serve: Callable[..., Served],
) -> None:
    stored = store(redis_url, data)
    ttl = 8
    prefix, cache = redis_tier(stored, ttl=ttl, memory=False)
    served = serve(stored, cache)
    client = redis.Redis.from_url(redis_url)
    try:
        one = request(data, "x1", 3)
        got = served.round_trip([one])
        assert cached_ids(got) == set()
        (key,) = stored_keys(client, prefix, 1)
        assert 0 < client.pttl(key) <= ttl * 1000

        left = client.pttl(key)
        if left < 3000:
            pytest.fail(f"the machine is too slow for this TTL: {left} ms left")
        two = one.again("x2")
        got.update(served.round_trip([two]))
        assert cached_ids(got) == {"x2"}

        deadline = time.monotonic() + ttl + 5
        while client.exists(key) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not client.exists(key), "Redis did not expire the entry"
        three = one.again("x3")
        got.update(served.round_trip([three]))
        assert cached_ids(got) == {"x2"}  # x3 was computed again
        assert_exact(session, [one, two, three], got)
        assert stored_keys(client, prefix, 1) == [key]  # and stored again
    finally:
        client.close()
    counters = served.counters()
    assert counters.hits("redis") == 1
    assert counters.get("streamfer_cache_misses_total") == 2


GARBAGE: list[tuple[str, Callable[[Any, bytes, bytes], None]]] = [
    ("no format prefix", lambda c, k, v: c.set(k, v[len(b"sfc1:") :])),
    ("another format", lambda c, k, v: c.set(k, b"sfc9:" + v[5:])),
    ("truncated", lambda c, k, v: c.set(k, v[:-4])),
    ("random bytes", lambda c, k, v: c.set(k, bytes(range(256)))),
    ("empty", lambda c, k, v: c.set(k, b"")),
    ("fields swapped", lambda c, k, v: c.set(k, b"sfc1:" + _swapped(v[5:]))),
    ("spaced JSON", lambda c, k, v: c.set(k, b"sfc1:" + v[5:].replace(b",", b", "))),
    ("a hash", lambda c, k, v: (c.delete(k), c.hset(k, "v", v))),
    ("a list", lambda c, k, v: (c.delete(k), c.rpush(k, v))),
]
"""Ways a cache key may hold something this worker did not write; the last two are other
Redis types, which MGET answers as absent."""


def _swapped(body: bytes) -> bytes:
    doc = orjson.loads(body)
    return orjson.dumps(dict(reversed(list(doc.items()))))


def test_garbage_under_cache_keys_is_a_miss_and_results_stay_right(
    data: FraudData,
    session: Any,
    redis_url: str,
    serve: Callable[..., Served],
) -> None:
    stored = store(redis_url, data)
    prefix, cache = redis_tier(stored, ttl=300, memory=False)
    served = serve(stored, cache)
    rows = [request(data, f"g{i}", i) for i in range(len(GARBAGE) * 3)]
    assert len({row_key(r.row) for r in rows}) == len(rows)
    got = served.round_trip(rows)
    client = redis.Redis.from_url(redis_url)
    try:
        keys = stored_keys(client, prefix, len(rows))
        assert len(keys) == len(rows)
        kinds = []
        for i, (key, value) in enumerate(zip(keys, client.mget(keys), strict=True)):
            kind, spoil = GARBAGE[i % len(GARBAGE)]
            spoil(client, key, value)
            kinds.append(kind)
        strings = sum(1 for k in kinds if k not in ("a hash", "a list"))

        spoiled = [r.again(f"s-{r.rid}") for r in rows]
        got_spoiled = served.round_trip(spoiled)
        assert_exact(session, spoiled, got_spoiled)
        assert cached_ids(got_spoiled) == set()
        counters = served.counters()
        assert counters.get("streamfer_cache_errors_total", kind="corrupt") == strings
        assert counters.get("streamfer_cache_errors_total", kind="redis") == 0
        assert counters.hits() == 0
        # computing them again put good values back, whatever type the key held
        assert all(v.startswith(b"sfc1:{") for v in client.mget(keys))
        assert all(client.type(k) == b"string" for k in keys)
    finally:
        client.close()

    assert served.counters().hits("redis") == 0
    all_from_cache(served, session, rows, got, "h")
    assert served.counters().hits("redis") == len(rows)


def test_an_unreachable_cache_redis_never_stops_the_pipeline(
    data: FraudData,
    session: Any,
    serve: Callable[..., Served],
) -> None:
    """Every feature inline, so the pipeline needs no Redis but the cache's, which is a
    port nobody listens on: results flow, repeats come from the process, errors count."""
    nowhere = Stored("unused", f"redis://127.0.0.1:{free_port()}/0")
    served = serve(nowhere, "redis_ttl_s = 60", lookups=False)
    base = [request(data, f"i{i}", i, inline_all=True) for i in range(20)]
    stream = base + [r.again(f"r{n}-{r.rid}") for n, r in enumerate(base * 3)]
    got = served.round_trip(stream)
    assert_exact(session, stream, got)
    distinct = {row_key(r.row) for r in stream}
    assert len(cached_ids(got)) == len(stream) - len(distinct)
    counters = served.counters()
    assert counters.get("streamfer_cache_errors_total", kind="redis") >= 1
    assert counters.hits("redis") == 0
    assert counters.hits() == len(stream) - len(distinct)
    assert "Redis tier failed" in served.worker.log_text()
    assert served.worker.alive()


# --- a Redis Cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    started = start_redis_cluster(nodes=3)
    try:
        # start_redis_cluster waits for the first node to say ok; a write routed to a
        # node that has not caught up yet fails with CLUSTERDOWN (seen once in 20 runs)
        deadline = time.monotonic() + 30
        pending = [node.address for node in started.nodes]
        while pending and time.monotonic() < deadline:
            pending = [url for url in pending if not _cluster_ok(url)]
            time.sleep(0.1)
        assert not pending, f"cluster nodes {pending} never said cluster_state:ok"
        yield started
    finally:
        started.stop()


def _cluster_ok(url: str) -> bool:
    node = redis.Redis.from_url(url)
    try:
        return bool(node.cluster("INFO")["cluster_state"] == "ok")
    finally:
        node.close()


def test_the_redis_tier_on_a_cluster_spreads_keys_over_its_nodes(
    cluster: RedisCluster,
    data: FraudData,
    session: Any,
    serve: Callable[..., Served],
) -> None:
    stored = store(cluster.address, data, cluster=True)
    prefix, cache = redis_tier(stored, ttl=120, memory=False)
    served = serve(stored, cache)
    rows = [request(data, f"c{i}", i) for i in range(40)]
    got = served.round_trip(rows)
    assert cached_ids(got) == set()
    client = redis.RedisCluster.from_url(cluster.address)
    try:
        keys = stored_keys(client, prefix, len(rows))
        assert len(keys) == len(rows)
        owners = {client.get_node_from_key(k).name for k in keys}
        assert len(owners) == 3, owners
        # one of them spoiled: a miss on a cluster too (GET answers WRONGTYPE for a hash)
        client.delete(keys[0])
        client.hset(keys[0], "v", "x")
    finally:
        client.close()
    again = [r.again(f"x-{r.rid}") for r in rows]
    got_again = served.round_trip(again)
    assert_exact(session, rows + again, {**got, **got_again})
    assert len(cached_ids(got_again)) == len(rows) - 1
    counters = served.counters()
    assert counters.hits("redis") == len(rows) - 1
    assert counters.get("streamfer_cache_errors_total", kind="corrupt") == 1
    assert counters.get("streamfer_cache_errors_total", kind="redis") == 0

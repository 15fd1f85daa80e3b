"""Models and records as users bring them, end to end against real Kafka and Redis.

Three recipes (``tests.integration.recipes``): a scikit-learn ColumnTransformer pipeline
(StandardScaler on numbers, OneHotEncoder on strings, logistic regression) exported with
skl2onnx's default options (a float and a string input, ZipMap on), a LightGBM
classifier converted with onnxmltools (whose label output declares one row), and an MLP
shaped as ``torch.onnx.export`` writes it (one input named ``input``, a dynamic batch
axis). Each is served with the same kind of config: the id at
``meta.request_id``, two lookups per request (the user's hash, with string features,
and the merchant's packed vector), inline features, and every published score is
compared with the framework's own prediction on the same rows. Bad values of every
kind come out as dead letters naming what was wrong.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis

from streamfer_dev.harness import Outcomes, collect_outcomes, produce_requests
from streamfer_dev.stack import start_redis_cluster
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, clean_env, streamfer
from tests.integration.recipes import (
    FraudData,
    Recipe,
    fraud_data,
    fraud_lookup_tables,
    lightgbm_classifier,
    sklearn_pipeline,
    torch_style_mlp,
)
from worker.features.stores import pack_vector

pytestmark = pytest.mark.integration

RECIPES: dict[str, Callable[[Path, FraudData], Recipe]] = {
    "sklearn-pipeline": sklearn_pipeline,
    "lightgbm": lightgbm_classifier,
    "torch-mlp": torch_style_mlp,
}
N_REQUESTS = 300
CLASS_NAMES = ["legit", "fraud"]


@pytest.fixture(scope="module")
def data() -> FraudData:
    return fraud_data(N_REQUESTS, seed=7)


def _toml(value: Any) -> str:
    return orjson.dumps(value).decode()


def _head(bootstrap: str, redis_url: str, topics: Topics, name: str, redis_extra: str = "") -> str:
    """The [kafka] and [redis] sections and a pipeline's topics, as every config here has them."""
    return f"""
[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{topics.group}"
session_timeout_ms = 10000

[redis]
url = "{redis_url}"
{redis_extra}

[[pipelines]]
name = "{name}"
request_topics = ["{topics.requests}"]
result_topic = "{topics.results}"
dead_letter_topic = "{topics.dead_letters}"
"""


def write_config(
    path: Path,
    *,
    bootstrap: str,
    redis_url: str,
    topics: Topics,
    tag: str,
    recipe: Recipe,
    class_names: list[str] | None,
    extra: str = "",
    cluster: bool = False,
) -> Path:
    """A config shaped like the example of docs/how-to/own-model.md: nested id, two lookups,
    typed inputs."""
    inputs = "\n".join(f"{name} = {_toml(cols)}" for name, cols in recipe.inputs.items())
    outputs = "\n".join(f"{field} = {_toml(out)}" for field, out in recipe.outputs.items())
    if class_names is not None:
        outputs += f"\nclass_names = {_toml(class_names)}"
    path.write_text(
        _head(bootstrap, redis_url, topics, "fraud", f"cluster = {'true' if cluster else 'false'}")
        + f"""

[pipelines.batch]
max_batch_size = 64
max_wait_ms = 20

[pipelines.request]
id = "meta.request_id"
features = "features"

{fraud_lookup_tables(tag)}

[pipelines.model]
path = "{recipe.model_path}"
name = "{recipe.name}"

[pipelines.model.inputs]
{inputs}

[pipelines.model.outputs]
{outputs}

{extra}
"""
    )
    return path


def store_features(redis_url: str, tag: str, data: FraudData, cluster: bool = False) -> None:
    client: Any = (redis.RedisCluster if cluster else redis.Redis).from_url(redis_url)
    pipe = client.pipeline(transaction=False)
    for uid, feats in data.users.items():
        pipe.hset(f"{tag}:user:{uid}", mapping={k: str(v) for k, v in feats.items()})
    for mid, feats in data.merchants.items():
        pipe.set(f"{tag}:merchant:{mid}", pack_vector([feats["risk"], feats["volume_30d"]]))
    # stored data of the wrong kind: a number field holding words, a string, not a hash
    some_user = next(iter(data.users.values()))
    pipe.hset(f"{tag}:user:words", mapping={**{k: str(v) for k, v in some_user.items()}})
    pipe.hset(f"{tag}:user:words", "age_days", "very old")
    pipe.set(f"{tag}:user:notahash", "a string where a hash was expected")
    pipe.execute()
    client.close()


def request_doc(rid: str, req: dict[str, Any], **inline: Any) -> dict[str, Any]:
    return {
        "meta": {"request_id": rid, "source": "test"},
        "user": {"id": req["user"]},
        "merchant_id": req["merchant"],
        "features": {"amount": req["amount"], "hour": req["hour"], **inline},
    }


def bad_requests(data: FraudData, recipe: Recipe) -> dict[str, tuple[dict[str, Any], str]]:
    """Request id -> (request, the dead-letter code it must get)."""
    base = data.requests[0]
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "bad-hour-text": (request_doc("bad-hour-text", {**base, "hour": "noon"}), "wrong_type"),
        "bad-no-hour": (
            {**request_doc("bad-no-hour", base), "features": {"amount": 1.0}},
            "missing_feature",
        ),
        "bad-stored-words": (
            request_doc("bad-stored-words", {**base, "user": "words"}),
            "bad_feature_value",
        ),
        "bad-not-a-hash": (
            request_doc("bad-not-a-hash", {**base, "user": "notahash"}),
            "feature_store_error",
        ),
        "bad-merchant": (
            request_doc("bad-merchant", {**base, "merchant": "nowhere"}),
            "unknown_entity",
        ),
        "bad-amount-huge": (
            request_doc("bad-amount-huge", {**base, "amount": 1e39}),
            "non_finite",  # beyond float32: infinite in a float input
        ),
    }
    if "country" in {c for cols in recipe.inputs.values() for c in cols}:
        bad["bad-country-number"] = (
            request_doc("bad-country-number", base, country=7),
            "wrong_type",
        )
    return bad


def served_config(
    recipe: Recipe,
    data: FraudData,
    *,
    bootstrap: str,
    redis_url: str,
    topics: Topics,
    path: Path,
    class_names: list[str] | None = None,
    extra: str = "",
    cluster: bool = False,
) -> Path:
    """Store the data's features under a fresh key prefix and write a config serving
    ``recipe`` from them."""
    tag = f"byo-{uuid.uuid4().hex[:8]}"
    store_features(redis_url, tag, data, cluster)
    return write_config(
        path,
        bootstrap=bootstrap,
        redis_url=redis_url,
        topics=topics,
        tag=tag,
        recipe=recipe,
        class_names=class_names,
        extra=extra,
        cluster=cluster,
    )


def burst(
    bootstrap: str,
    topics: Topics,
    config: Path,
    produced: list[tuple[str, bytes | None, bytes | None]],
    env: dict[str, str] | None = None,
) -> Outcomes:
    """Produce, drain with one worker (``run --burst-idle-s``), and read every outcome."""
    produce_requests(bootstrap, topics.requests, produced)
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    ids = {rid for rid, _key, _value in produced}
    out = collect_outcomes(
        bootstrap, topics.results, topics.dead_letters, ids, timeout=60, keep_docs=True
    )
    assert out.lost(ids) == []
    assert out.duplicates() == 0
    return out


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_recipe_scores_equal_the_frameworks_own(
    recipe_name: str,
    data: FraudData,
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    recipe = RECIPES[recipe_name](tmp_path, data)
    topics = fresh_topics(3)
    names = CLASS_NAMES if "label" in recipe.outputs else None
    config = served_config(
        recipe,
        data,
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topics=topics,
        path=tmp_path / "fraud.toml",
        class_names=names,
    )

    check = streamfer("check", "--config", str(config), "--skip-kafka", timeout=180)
    assert check.returncode == 0, check.stderr[-3000:]
    for name, cols in recipe.inputs.items():
        assert f"input {name} " in check.stdout, check.stdout
        assert f"<- {cols[0]} (" in check.stdout

    # good requests: every tenth one overrides a stored string inline (when one is used)
    uses_country = any("country" in cols for cols in recipe.inputs.values())
    rows = data.rows()
    good: dict[str, tuple[bytes, dict[str, Any]]] = {}
    produced: list[tuple[str, bytes | None, bytes | None]] = []
    for i, req in enumerate(data.requests):
        rid = f"{recipe_name}-{i}"
        inline = {"country": "JP"} if uses_country and i % 10 == 0 else {}
        row = {**rows[i], **inline}
        key = f"k{i}".encode()
        good[rid] = (key, row)
        produced.append((rid, key, orjson.dumps(request_doc(rid, req, **inline))))
    bad = bad_requests(data, recipe)
    produced += [(rid, b"bad", orjson.dumps(doc)) for rid, (doc, _code) in bad.items()]
    out = burst(kafka_bootstrap, topics, config, produced)

    dead = {d["request_id"]: d for d in out.dead_letter_docs}
    assert {rid: d["code"] for rid, d in dead.items()} == {
        rid: code for rid, (_doc, code) in bad.items()
    }, {rid: d["reason"] for rid, d in dead.items()}
    assert "'age_days' is not a number" in dead["bad-stored-words"]["reason"]
    assert "WRONGTYPE" in dead["bad-not-a-hash"]["reason"]
    assert "feature 'amount'" in dead["bad-amount-huge"]["reason"]

    results = {d["id"]: d for d in out.result_docs}
    assert set(results) == set(good)
    order = list(good)
    expected = recipe.predict_proba([good[rid][1] for rid in order])
    got = np.array([results[rid]["outputs"]["scores"] for rid in order], dtype=np.float64)
    assert got.shape == expected.shape
    diff = float(np.abs(got - expected).max())
    print(f"{recipe_name}: {len(order)} results, largest score difference {diff:.2e}")
    assert diff < 1e-5, f"{recipe_name}: scores differ from the framework's by up to {diff}"
    for rid in order:
        assert results[rid]["key"] == good[rid][0].decode()
    if names is not None:
        labels = [results[rid]["outputs"]["label"] for rid in order]
        assert labels == [names[int(i)] for i in expected.argmax(axis=1)]
    assert_committed_to_end(kafka_bootstrap, topics.group, topics.requests)


def test_batch_hooks_shape_inputs_and_results_end_to_end(
    data: FraudData,
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    """The guide's hooks (``streamfer_dev.example_hooks``) around the MLP recipe."""
    from streamfer_dev.example_hooks import AMOUNT_CAP

    recipe = torch_style_mlp(tmp_path, data)
    topics = fresh_topics(2)
    config = served_config(
        recipe,
        data,
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topics=topics,
        path=tmp_path / "hooks.toml",
        extra=(
            "[pipelines.hooks]\n"
            'prepare = "streamfer_dev.example_hooks:prepare"\n'
            'postprocess = "streamfer_dev.example_hooks:postprocess"\n'
        ),
    )
    rows = data.rows()
    good: dict[str, dict[str, Any]] = {}
    produced: list[tuple[str, bytes | None, bytes | None]] = []
    for i, req in enumerate(data.requests[:120]):
        rid = f"hook-{i}"
        amount = req["amount"] if i % 7 else 20_000.0  # every seventh is capped
        good[rid] = {**rows[i], "amount": min(float(amount), AMOUNT_CAP)}
        doc = request_doc(rid, {**req, "amount": amount})
        produced.append((rid, f"k{i}".encode(), orjson.dumps(doc)))
    probe = request_doc("hook-probe", data.requests[0])
    probe["meta"]["source"] = "probe"
    produced.append(("hook-probe", b"p", orjson.dumps(probe)))
    out = burst(kafka_bootstrap, topics, config, produced)
    (dead,) = out.dead_letter_docs
    assert (dead["request_id"], dead["code"]) == ("hook-probe", "model_error")
    assert "prepare hook raised ValueError: probe requests are not scored" in dead["reason"]
    results = {d["id"]: d["outputs"] for d in out.result_docs}
    order = list(good)
    expected = recipe.predict_proba([good[rid] for rid in order])[:, 1]
    got = np.array([results[rid]["p_fraud"] for rid in order])
    assert float(np.abs(got - expected).max()) < 1e-5
    assert [results[rid]["decision"] for rid in order] == [
        "review" if p > 0.5 else "pass" for p in expected
    ]
    assert set(results[order[0]]) == {"p_fraud", "decision"}


def test_two_lookups_from_a_redis_cluster_in_one_round_trip(
    data: FraudData,
    kafka_bootstrap: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    """A hash and a packed lookup whose keys live on three cluster nodes: each node gets
    its share of both lookups' commands in one write."""
    recipe = sklearn_pipeline(tmp_path, data)
    started = start_redis_cluster(nodes=3)
    try:
        topics = fresh_topics(2)
        config = served_config(
            recipe,
            data,
            bootstrap=kafka_bootstrap,
            redis_url=started.address,
            topics=topics,
            path=tmp_path / "cluster.toml",
            cluster=True,
        )
        rows = data.rows()
        produced: list[tuple[str, bytes | None, bytes | None]] = [
            (f"clu-{i}", None, orjson.dumps(request_doc(f"clu-{i}", req)))
            for i, req in enumerate(data.requests)
        ]
        produced.append(
            (
                "clu-wrongtype",
                None,
                orjson.dumps(
                    request_doc("clu-wrongtype", {**data.requests[0], "user": "notahash"})
                ),
            )
        )
        out = burst(kafka_bootstrap, topics, config, produced, env=clean_env())
    finally:
        started.stop()
    ((dead_id, code),) = [(d["request_id"], d["code"]) for d in out.dead_letter_docs]
    assert (dead_id, code) == ("clu-wrongtype", "feature_store_error")
    results = {d["id"]: d["outputs"]["scores"] for d in out.result_docs}
    expected = recipe.predict_proba(rows)
    got = np.array([results[f"clu-{i}"] for i in range(len(rows))])
    assert float(np.abs(got - expected).max()) < 1e-5


def test_a_config_that_does_not_fit_the_model_stops_start_up_with_exit_2(
    data: FraudData,
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    recipe = sklearn_pipeline(tmp_path, data)
    narrow = Recipe(
        recipe.name,
        recipe.model_path,
        {"numeric": ["amount", "hour", "age_days", "risk"], "categorical": ["country", "segment"]},
        recipe.outputs,
        recipe.predict_proba,
    )
    config = served_config(
        narrow,
        data,
        bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topics=fresh_topics(1),
        path=tmp_path / "narrow.toml",
    )
    for command in ("check", "run"):
        proc = streamfer(command, "--config", str(config), timeout=180)
        assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
        assert (
            "input 'numeric' (numeric float[batch, 5]) takes 5 columns but 4 features feed it"
            in proc.stderr
        )


def test_an_array_of_features_and_no_lookups(
    data: FraudData,
    kafka_bootstrap: str,
    redis_url: str,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    """Requests that carry every value as one array, for a model with one input: no
    lookups, no inputs table (the array's order is the columns' order)."""
    recipe = torch_style_mlp(tmp_path, data)
    (columns,) = recipe.inputs.values()
    topics = fresh_topics(1)
    config = tmp_path / "array.toml"
    config.write_text(
        _head(kafka_bootstrap, redis_url, topics, "array")
        + f"""

[pipelines.request]
features = "x"
features_array = {_toml(columns)}

[pipelines.model]
path = "{recipe.model_path}"
name = "mlp"
outputs = {{ scores = "output" }}
"""
    )
    rows = data.rows()[:100]
    produced: list[tuple[str, bytes | None, bytes | None]] = [
        (f"arr-{i}", None, orjson.dumps({"id": f"arr-{i}", "x": [row[c] for c in columns]}))
        for i, row in enumerate(rows)
    ]
    produced.append(("arr-short", None, orjson.dumps({"id": "arr-short", "x": [1.0, 2.0]})))
    out = burst(kafka_bootstrap, topics, config, produced)
    (dead,) = out.dead_letter_docs
    assert (dead["request_id"], dead["code"]) == ("arr-short", "wrong_type")
    assert "must hold 5 values" in dead["reason"]
    results = {d["id"]: d["outputs"]["scores"] for d in out.result_docs}
    got = np.array([results[f"arr-{i}"] for i in range(len(rows))])
    assert float(np.abs(got - recipe.predict_proba(rows)).max()) < 1e-5

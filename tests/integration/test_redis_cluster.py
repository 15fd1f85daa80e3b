"""Features from a Redis Cluster: three primaries started by the test, keys spread over
them by slot, and a worker that sends each node its share of a batch in one write."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
import redis
from redis.crc import key_slot

from streamfer_dev.harness import collect_outcomes, produce_requests
from streamfer_dev.modelgen import DemoModel, seed_entities
from streamfer_dev.stack import RedisCluster, start_redis_cluster
from tests.conftest import Topics
from tests.integration.helpers import (
    assert_committed_to_end,
    clean_env,
    streamfer,
    write_config_with_redis,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(model: DemoModel) -> Iterator[RedisCluster]:
    started = start_redis_cluster(nodes=3)
    try:
        client = redis.RedisCluster.from_url(started.address)
        seed_entities(client, model, prefix="clu-", key_template="features:{entity}")
        seed_entities(client, model, prefix="clu-", key_template="packed:{entity}", layout="packed")
        client.set("features:clu-string", "not a hash")  # a key of the wrong type
        client.close()
        yield started
    finally:
        started.stop()


def _config(
    path: Path, bootstrap: str, t: Topics, model: DemoModel, url: str, layout: str, cluster: bool
) -> Path:
    return write_config_with_redis(
        path,
        bootstrap=bootstrap,
        topics=t,
        model=model,
        redis_url=url,
        redis_lines="cluster = true" if cluster else "",
        layout=layout,
        key_template="features:{entity}" if layout == "hash" else "packed:{entity}",
    )


@pytest.mark.parametrize("layout", ["hash", "packed"])
def test_a_worker_reads_features_from_every_node_of_a_cluster(
    cluster: RedisCluster,
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
    layout: str,
) -> None:
    t = fresh_topics(2)
    config = _config(tmp_path / "w.toml", kafka_bootstrap, t, model, cluster.address, layout, True)
    check = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert check.returncode == 0, check.stdout + check.stderr

    entities = [f"clu-{i}" for i in range(60)]
    client = redis.RedisCluster.from_url(cluster.address)
    owners = {
        client.nodes_manager.get_node_from_slot(key_slot(f"features:{e}".encode())).name
        for e in entities
    }
    client.close()
    assert len(owners) == 3, "the batch's keys live on all three nodes"

    ids = {f"{layout}{i}" for i in range(300)}
    produce_requests(
        kafka_bootstrap,
        t.requests,
        [
            (rid, None, orjson.dumps({"id": rid, "entity": entities[n % len(entities)]}))
            for n, rid in enumerate(sorted(ids))
        ],
    )
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", env=clean_env())
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, ids, timeout=60)
    assert outcomes.lost(ids) == []
    assert not outcomes.dead_letters, "every entity was found on its node"
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def test_a_key_of_the_wrong_type_in_a_cluster_dead_letters_only_its_requests(
    cluster: RedisCluster,
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    config = _config(tmp_path / "w.toml", kafka_bootstrap, t, model, cluster.address, "hash", True)
    requests = [("good", "clu-1"), ("wrong", "clu-string"), ("after", "clu-2")]
    produce_requests(
        kafka_bootstrap,
        t.requests,
        [(rid, None, orjson.dumps({"id": rid, "entity": e})) for rid, e in requests],
    )
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", env=clean_env())
    assert run.returncode == 0, run.stderr[-3000:]
    ids = {"good", "wrong", "after"}
    outcomes = collect_outcomes(
        kafka_bootstrap, t.results, t.dead_letters, ids, timeout=60, keep_docs=True
    )
    assert outcomes.lost(ids) == []
    assert set(outcomes.results) == {"good", "after"}
    codes = {doc["request_id"]: doc["code"] for doc in outcomes.dead_letter_docs}
    assert codes == {"wrong": "feature_store_error"}


def test_a_cluster_node_without_cluster_mode_says_to_set_it(
    cluster: RedisCluster,
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    config = _config(tmp_path / "w.toml", kafka_bootstrap, t, model, cluster.address, "hash", False)
    check = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert check.returncode == 2, check.stdout + check.stderr
    assert "set redis.cluster = true" in check.stderr, check.stderr

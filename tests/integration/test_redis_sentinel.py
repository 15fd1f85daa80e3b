"""Features through Redis Sentinel: a primary, a replica and three real Sentinels started
by the test; ``check`` names the primary they give, a worker serves from it (its output
cache writes there too), and after a failover all of them follow the promoted replica.
The failover under steady load is a scenario of the fault harness
(``test_guarantees.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
import redis

from streamfer_dev.harness import collect_outcomes, produce_requests
from streamfer_dev.modelgen import DemoModel, seed_entities
from streamfer_dev.redis_sentinel import SERVICE_NAME, RedisSentinel, start_redis_sentinel
from streamfer_dev.stack import Service, free_port
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, clean_env, streamfer

pytestmark = pytest.mark.integration


@pytest.fixture
def sentinel_group(model: DemoModel) -> Iterator[RedisSentinel]:
    started = start_redis_sentinel()
    try:
        client = redis.Redis.from_url(started.primary().address)
        seed_entities(client, model, prefix="sen-")
        assert client.wait(1, 5000) == 1, "the replica has the features before any failover"
        client.close()
        yield started
    finally:
        started.stop()


ENTITIES = [f"sen-{i}" for i in range(80)]
CACHE_TABLE = """
[pipelines.cache]
enabled = true
max_entries = 0
redis_ttl_s = 600
redis_key_prefix = "sencache:"
redis_timeout_ms = 2000
"""
"""The output cache in Redis only, so that every output is written there."""


def _cached(node: Service) -> int:
    client = redis.Redis.from_url(node.address)
    try:
        return sum(1 for _ in client.scan_iter("sencache:*"))
    finally:
        client.close()


def _sentinel_table(addresses: list[str]) -> str:
    return (
        f"sentinels = {orjson.dumps(addresses).decode()}\n"
        f'service_name = "{SERVICE_NAME}"\nsocket_timeout_s = 2.0'
    )


def _serve(bootstrap: str, config: Path, t: Topics, ids: list[str], entities: list[str]) -> None:
    """Produce one request per id, run a burst worker over them: every one answered."""
    produce_requests(
        bootstrap,
        t.requests,
        [
            (rid, None, orjson.dumps({"id": rid, "entity": entities[n % len(entities)]}))
            for n, rid in enumerate(ids)
        ],
    )
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", env=clean_env())
    assert run.returncode == 0, run.stderr[-3000:]
    wanted = set(ids)
    outcomes = collect_outcomes(bootstrap, t.results, t.dead_letters, wanted, timeout=60)
    assert outcomes.lost(wanted) == []
    assert not outcomes.dead_letters, "every entity was found on the primary"
    assert_committed_to_end(bootstrap, t.group, t.requests)


def test_check_names_the_primary_and_the_worker_follows_a_failover(
    sentinel_group: RedisSentinel,
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
) -> None:
    t = fresh_topics(2)
    config = write_config(
        t, redis_table=_sentinel_table(sentinel_group.addresses), extra=CACHE_TABLE
    )
    first = sentinel_group.primary()
    check = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
    at = first.address.removeprefix("redis://").removesuffix("/0")
    assert f"ok: redis sentinel: service '{SERVICE_NAME}': primary {at} " in check.stdout
    _serve(kafka_bootstrap, config, t, [f"a{i}" for i in range(200)], ENTITIES[:40])
    assert _cached(first) > 0, "the output cache's Redis tier wrote to the primary"

    promoted = sentinel_group.wait_for_new_primary(sentinel_group.kill_primary())
    before = _cached(promoted)  # what the replica had copied
    check = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
    now = promoted.address.removeprefix("redis://").removesuffix("/0")
    assert now != at
    assert f"primary {now} " in check.stdout, check.stdout
    _serve(kafka_bootstrap, config, t, [f"b{i}" for i in range(200)], ENTITIES[40:80])
    assert _cached(promoted) > before, "new outputs are cached on the promoted primary"


def test_check_fails_naming_the_service_when_no_sentinel_answers(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path]
) -> None:
    nobody = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    config = write_config(fresh_topics(1), redis_table=_sentinel_table(nobody))
    check = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert check.returncode != 0, check.stdout + check.stderr
    assert (
        f"FAIL: redis sentinel: no Sentinel of {', '.join(nobody)} names a primary for "
        f"service '{SERVICE_NAME}'"
    ) in check.stdout, check.stdout + check.stderr

"""Redis errors against a real redis-server: a record's, an outage's or the configuration's.

A key holding the wrong type refuses only its own request; an entity id that could name
another key is refused at decode; an ACL user the worker may not run its command as fails
start-up with exit code 2, and one whose permission is taken away at run time makes the
worker wait (not ready, no dead letters) until it is given back.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

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
from streamfer_dev.modelgen import DemoModel
from tests.conftest import Topics
from tests.integration.helpers import (
    assert_valid,
    eventually,
    http_get,
    streamfer,
    validator,
    wait_committed_to_end,
)

pytestmark = pytest.mark.integration


def request(rid: str, entity: str) -> tuple[str, bytes, bytes]:
    return rid, rid.encode(), orjson.dumps({"id": rid, "entity": entity})


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def acl_user(client: redis.Redis) -> Iterator[Callable[..., tuple[str, str]]]:
    """Factory: a fresh ACL user with these rules; deleted after the test."""
    made: list[str] = []

    def make(*rules: str) -> tuple[str, str]:
        name, password = f"streamfer-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        client.execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", *rules)
        made.append(name)
        return name, password

    yield make
    for name in made:
        client.execute_command("ACL", "DELUSER", name)


def served(
    bootstrap: str, t: Topics, ids: set[str], bad: set[str] | None = None, timeout: float = 60
) -> Outcomes:
    """Results and dead letters of ``ids`` (and of the records at ``bad`` positions)."""
    return collect_outcomes(
        bootstrap, t.results, t.dead_letters, ids, bad, timeout=timeout, keep_docs=True
    )


def test_key_holding_a_string_dead_letters_only_its_request(
    kafka_bootstrap: str,
    entities: list[str],
    client: redis.Redis,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    odd = f"wrongtype-{uuid.uuid4().hex[:8]}"
    client.set(f"features:{odd}", b"a string, not a hash")
    worker = WorkerProcess(write_config(t, max_wait_ms=50), tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 1, timeout=60)
        positions = produce_requests(
            kafka_bootstrap,
            t.requests,
            [request("before", entities[0]), request("odd", odd), request("after", entities[1])],
        )
        first = served(kafka_bootstrap, t, {"before", "odd", "after"}, {positions["odd"]})
        # a later batch is served too: the worker is not stuck on the odd key
        produce_requests(kafka_bootstrap, t.requests, [request("later", entities[2])])
        # until the earlier dead letter is read too: the result alone may come in first
        later = served(kafka_bootstrap, t, {"later"}, {positions["odd"]})
        assert worker.alive(), worker.log_text()[-3000:]
        wait_committed_to_end(kafka_bootstrap, t.group, t.requests)
    finally:
        code = worker.terminate()
        client.delete(f"features:{odd}")
    assert code == 0, worker.log_text()[-3000:]

    assert set(first.results) == {"before", "after"}
    assert set(later.results) == {"before", "after", "later"}  # read from the start
    assert later.dead_letter_ids == {"odd"}
    (dead,) = first.dead_letter_docs
    assert_valid(validator("dead-letter"), dead)
    assert (dead["stage"], dead["code"], dead["request_id"]) == (
        "features",
        "feature_store_error",
        "odd",
    )
    assert "WRONGTYPE" in dead["reason"]
    assert f"features:{odd}" in dead["reason"]
    assert first.duplicates() == 0


def test_entity_that_could_name_another_key_is_refused_at_decode(
    kafka_bootstrap: str,
    entities: list[str],
    client: redis.Redis,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    tag = uuid.uuid4().hex[:8]
    # A real hash under the key the colon would reach: without the rule it would be served.
    sneaky = f"features:inv-{tag}:x"
    client.hset(sneaky, mapping=dict.fromkeys(model.fields, "1"))
    bad = {"colon": f"inv-{tag}:x", "braces": "{" + entities[0] + "}", "glob": f"{entities[0]}*"}
    schema = validator("request")
    for rid, entity in bad.items():
        assert not schema.is_valid({"id": rid, "entity": entity}), entity
    worker = WorkerProcess(write_config(t, max_wait_ms=50), tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 1, timeout=60)
        positions = produce_requests(
            kafka_bootstrap,
            t.requests,
            [*(request(rid, e) for rid, e in bad.items()), request("next", entities[3])],
        )
        # refused at decode, before the id is read: counted by position
        outcomes = served(kafka_bootstrap, t, {"next"}, {positions[r] for r in bad})
        assert worker.alive(), worker.log_text()[-3000:]
        wait_committed_to_end(kafka_bootstrap, t.group, t.requests)
    finally:
        code = worker.terminate()
        client.delete(sneaky)
    assert code == 0, worker.log_text()[-3000:]

    assert set(outcomes.results) == {"next"}
    by_position = {
        "{topic}/{partition}/{offset}".format(**d["source"]): d for d in outcomes.dead_letter_docs
    }
    assert set(by_position) == {positions[rid] for rid in bad}
    for doc in by_position.values():
        assert (doc["stage"], doc["code"]) == ("schema", "invalid_entity"), doc
        assert_valid(validator("dead-letter"), doc)


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(("~features:*", "+@all", "-hmget"), id="command-denied"),
        pytest.param(("~elsewhere:*", "+@all"), id="key-denied"),
    ],
)
def test_acl_user_without_hmget_on_the_keys_fails_start_up_with_exit_2(
    rules: tuple[str, ...],
    acl_user: Callable[..., tuple[str, str]],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
) -> None:
    user, password = acl_user(*rules)
    config = str(write_config(fresh_topics(1)))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STREAMFER_")},
        "STREAMFER_REDIS__USERNAME": user,
        "STREAMFER_REDIS__PASSWORD": password,
    }
    grant = f"ACL SETUSER {user} +hmget ~features:*"
    for command in ("run", "check"):
        # Before the probe, ``run`` started and then stalled on its first batch: the
        # timeout here would fail the test.
        proc = streamfer(command, "--config", config, env=env, timeout=90)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2, f"{command}: {output[-3000:]}"
        assert "NOPERM" in output, output[-3000:]
        assert grant in output, output[-3000:]


def test_permission_taken_away_at_run_time_makes_the_worker_wait_not_dead_letter(
    kafka_bootstrap: str,
    entities: list[str],
    client: redis.Redis,
    acl_user: Callable[..., tuple[str, str]],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    user, password = acl_user("~*", "+@all")
    t = fresh_topics(1)
    config = write_config(t, max_wait_ms=20, extra='[metrics]\nhost = "127.0.0.1"\nport = 0\n')
    env = {"STREAMFER_REDIS__USERNAME": user, "STREAMFER_REDIS__PASSWORD": password}
    worker = WorkerProcess(config, tmp_path / "worker.log", env=env).start()
    ids = {f"w{i}" for i in range(20)}
    try:
        wait_for_assignment([worker], 1, timeout=60)
        port = int(re.findall(r"/readyz on http://127\.0\.0\.1:(\d+)", worker.log_text())[-1])
        assert _status(port, "/readyz") == 200
        client.execute_command("ACL", "SETUSER", user, "-hmget")
        produce_requests(
            kafka_bootstrap,
            t.requests,
            [request(rid, entities[n]) for n, rid in enumerate(sorted(ids))],
        )
        assert eventually(lambda: "NOPERM" in worker.log_text()), worker.log_text()[-3000:]
        assert eventually(lambda: _status(port, "/readyz") == 503)
        body = _body(port, "/readyz")
        assert "feature store: Redis refused HMGET" in body and "NOPERM" in body, body
        assert _status(port, "/healthz") == 200
        waiting = served(kafka_bootstrap, t, ids, timeout=3)
        assert not waiting.results and not waiting.dead_letters  # held back, not refused

        client.execute_command("ACL", "SETUSER", user, "+hmget")
        outcomes = served(kafka_bootstrap, t, ids, timeout=90)
        assert eventually(lambda: _status(port, "/readyz") == 200)
        assert worker.alive(), worker.log_text()[-3000:]
        wait_committed_to_end(kafka_bootstrap, t.group, t.requests)
    finally:
        code = worker.terminate()
    log = worker.log_text()
    assert code == 0, log[-3000:]
    assert outcomes.lost(ids) == []
    assert not outcomes.dead_letters
    refusals = [line for line in log.splitlines() if "NOPERM" in line]
    assert 1 <= len(refusals) <= 3, refusals  # logged when it starts, not once per record
    assert f"ACL SETUSER {user} +hmget ~features:*" in refusals[0]


def _status(port: int, path: str) -> int:
    return http_get(port, path)[0]


def _body(port: int, path: str) -> str:
    return http_get(port, path)[1]

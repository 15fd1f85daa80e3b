"""The feature store over TLS with a private CA and an ACL user: a real redis-server
speaking TLS only, certificates made by the test, and a worker that reads features as a
user allowed nothing but reads of ``features:*``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
import redis

from streamfer_dev.harness import collect_outcomes, produce_requests
from streamfer_dev.modelgen import DemoModel, seed_entities
from streamfer_dev.stack import Service, start_redis
from tests.conftest import Topics
from tests.integration.helpers import (
    assert_committed_to_end,
    clean_env,
    streamfer,
    write_config_with_redis,
)
from tests.integration.tls import Certificates, make_certificates

pytestmark = pytest.mark.integration

USER = "scorer"
PASSWORD = "tls-Pa55/word#?"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Certificates]]:
    certs = make_certificates(tmp_path_factory.mktemp("redis-tls"))
    service = start_redis(tls=(certs.cert, certs.key))
    try:
        admin = redis.Redis.from_url(service.address, ssl_ca_certs=str(certs.ca))
        admin.acl_setuser(
            USER,
            enabled=True,
            passwords=[f"+{PASSWORD}"],
            keys=["features:*"],
            categories=["+@read", "+@connection"],
        )
        admin.close()
        yield service, certs
    finally:
        service.stop()


@pytest.fixture(scope="module")
def tls_entities(tls_redis: tuple[Service, Certificates], model: DemoModel) -> list[str]:
    service, certs = tls_redis
    admin = redis.Redis.from_url(service.address, ssl_ca_certs=str(certs.ca))
    try:
        return seed_entities(admin, model, prefix="tls-")
    finally:
        admin.close()


def _config(
    path: Path, bootstrap: str, t: Topics, model: DemoModel, url: str, redis_lines: str
) -> Path:
    return write_config_with_redis(
        path, bootstrap=bootstrap, topics=t, model=model, redis_url=url, redis_lines=redis_lines
    )


def test_a_worker_reads_features_over_tls_as_an_acl_user(
    tls_redis: tuple[Service, Certificates],
    tls_entities: list[str],
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    service, certs = tls_redis
    t = fresh_topics(2)
    (tmp_path / "redis-password").write_text(PASSWORD + "\n")
    lines = f'ssl_ca_certs = "{certs.ca}"\nusername = "{USER}"\npassword_file = "redis-password"\n'
    config = _config(tmp_path / "w.toml", kafka_bootstrap, t, model, service.address, lines)
    check = streamfer("check", "--config", str(config), env=clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok: pipeline demo" in check.stdout

    ids = {f"tls{i}" for i in range(300)}
    produce_requests(
        kafka_bootstrap,
        t.requests,
        [
            (rid, None, orjson.dumps({"id": rid, "entity": tls_entities[n % 40]}))
            for n, rid in enumerate(sorted(ids))
        ],
    )
    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", env=clean_env())
    assert run.returncode == 0, run.stderr[-3000:]
    assert PASSWORD not in run.stderr
    outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, ids, timeout=60)
    assert outcomes.lost(ids) == []
    assert not outcomes.dead_letters, "every entity was found over TLS"
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def test_without_the_private_ca_the_certificate_is_refused(
    tls_redis: tuple[Service, Certificates],
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    service, _ = tls_redis
    lines = f'username = "{USER}"\npassword = "{PASSWORD}"\n'
    config = _config(
        tmp_path / "w.toml", kafka_bootstrap, fresh_topics(1), model, service.address, lines
    )
    proc = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "certificate verify failed" in proc.stderr, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr


def test_a_wrong_password_over_tls_is_refused_without_echoing_it(
    tls_redis: tuple[Service, Certificates],
    kafka_bootstrap: str,
    model: DemoModel,
    fresh_topics: Callable[..., Topics],
    tmp_path: Path,
) -> None:
    service, certs = tls_redis
    wrong = "not-the/password#1"
    lines = f'ssl_ca_certs = "{certs.ca}"\nusername = "{USER}"\npassword = "{wrong}"\n'
    config = _config(
        tmp_path / "w.toml", kafka_bootstrap, fresh_topics(1), model, service.address, lines
    )
    proc = streamfer("check", "--config", str(config), "--skip-kafka", env=clean_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Redis" in proc.stderr
    assert wrong not in proc.stdout + proc.stderr

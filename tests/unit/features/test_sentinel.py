"""Redis Sentinel settings, the client they build and ``check``'s line: no Sentinel is
asked here (``tests/integration/test_redis_sentinel.py`` asks real ones)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.sentinel import MasterNotFoundError, SentinelConnectionPool

from worker.config import RedisSettings, load_config, parse_config, redacted
from worker.errors import ConfigError
from worker.features import Command, redis_client
from worker.tools import redis_check
from worker.tools.redis_check import check_sentinel

DOC = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "redis-sentinel.md"

SENTINELS = {"sentinels": ["s1:26379", "[::1]:26380"], "service_name": "features"}


def _raw(tmp_path: Path, **redis_table: Any) -> dict[str, Any]:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    return {
        "redis": redis_table,
        "pipelines": [
            {
                "name": "p",
                "request_topics": ["req"],
                "result_topic": "res",
                "dead_letter_topic": "dlq",
                "features": {"fields": ["a"]},
                "model": {"path": str(model), "name": "m"},
            }
        ],
    }


def _refusal(tmp_path: Path, **redis_table: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(_raw(tmp_path, **redis_table), environ={})
    return str(info.value)


def test_the_documented_example_loads(tmp_path: Path) -> None:
    text = DOC.read_text()
    toml = re.search(r"```toml\n(.*?)```", text, re.S)
    assert toml is not None
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "fraud.onnx").write_bytes(b"")
    (tmp_path / "pw").write_text("primary-secret\n")
    (tmp_path / "spw").write_text("sentinel-secret\n")
    body = toml.group(1).replace("/run/secrets/redis-password", str(tmp_path / "pw"))
    body = body.replace("/run/secrets/sentinel-password", str(tmp_path / "spw"))
    (tmp_path / "w.toml").write_text(body)
    rds = load_config(tmp_path / "w.toml", environ={}).redis
    assert rds.sentinel_addresses() == [
        ("sentinel-1", 26379),
        ("sentinel-2", 26379),
        ("sentinel-3", 26379),
    ]
    assert rds.service_name == "features"
    assert rds.password is not None and rds.password.get_secret_value() == "primary-secret"
    assert rds.sentinel_password is not None
    assert rds.sentinel_password.get_secret_value() == "sentinel-secret"
    assert rds.tls and rds.sentinel_tls


def test_sentinel_passwords_never_print(tmp_path: Path) -> None:
    cfg = parse_config(_raw(tmp_path, sentinel_password="s3cret", **SENTINELS), environ={})
    shown = [repr(cfg), str(redacted(cfg)), cfg.model_dump_json()]
    assert all("s3cret" not in text for text in shown)


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ({"sentinels": ["s1:26379"]}, "service_name is required"),
        ({**SENTINELS, "service_name": "  "}, "service_name is required"),
        ({**SENTINELS, "url": "redis://r:6379/0"}, "url: the Sentinels name the primary"),
        ({**SENTINELS, "url_file": "u.txt"}, "url_file: the Sentinels name the primary"),
        ({**SENTINELS, "cluster": True}, "cluster = true cannot go with sentinels"),
        ({"service_name": "features"}, "service_name: only with redis.sentinels"),
        ({"tls": True, "database": 2}, "database, tls: only with redis.sentinels"),
        ({"sentinel_password": "x"}, "sentinel_password: only with redis.sentinels"),
        ({**SENTINELS, "database": -1}, "redis.database"),
    ],
)
def test_settings_that_would_be_ignored_are_refused_by_name(
    tmp_path: Path, table: dict[str, Any], named: str
) -> None:
    assert named in _refusal(tmp_path, **table)


@pytest.mark.parametrize("address", ["s1", "s1:", ":26379", "s1:0", "s1:65536", "s1:x", "s1:²"])
def test_an_address_that_is_not_host_and_port_is_refused(tmp_path: Path, address: str) -> None:
    text = _refusal(tmp_path, sentinels=["ok:1", address], service_name="features")
    assert f'sentinel {address!r} is not "host:port"' in text


def test_the_environment_sets_the_sentinels_and_keeps_passwords_verbatim(tmp_path: Path) -> None:
    environ = {
        "STREAMFER_REDIS__SENTINELS": '["a:1", "b:2"]',
        "STREAMFER_REDIS__SERVICE_NAME": "features",
        "STREAMFER_REDIS__SENTINEL_PASSWORD": "1e3",
    }
    rds = parse_config(_raw(tmp_path), environ=environ).redis
    assert rds.sentinel_addresses() == [("a", 1), ("b", 2)]
    assert rds.sentinel_password is not None
    assert rds.sentinel_password.get_secret_value() == "1e3"


def test_the_client_asks_the_sentinels_for_the_primary_with_each_ones_credentials() -> None:
    settings = RedisSettings.model_validate(
        {
            **SENTINELS,
            "database": 3,
            "username": "reader",
            "password": "primary-pw",
            "sentinel_username": "watcher",
            "sentinel_password": "sentinel-pw",
            "socket_timeout_s": 1.5,
        }
    )
    client = redis_client(settings)  # connects lazily: nothing is asked yet
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "features" and pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"]) == (3, "reader", "primary-pw")
    assert kwargs["socket_timeout"] == 1.5
    asked = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(k["host"], k["port"]) for k in asked] == [("s1", 26379), ("::1", 26380)]
    assert all((k["username"], k["password"]) == ("watcher", "sentinel-pw") for k in asked)
    command = Command.of("HMGET", client, _spec())
    assert command.user == "reader"  # an ACL refusal names the primary's user


def test_tls_is_asked_for_separately_of_the_primary_and_of_the_sentinels() -> None:
    settings = RedisSettings.model_validate({**SENTINELS, "tls": True, "ssl_ca_certs": "/ca.pem"})
    client = redis_client(settings)
    assert client.connection_pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
    sentinel = client.connection_pool.sentinel_manager.sentinels[0]  # type: ignore[attr-defined]
    assert sentinel.connection_pool.connection_class is redis.Connection
    both = RedisSettings.model_validate({**SENTINELS, "sentinel_tls": True})
    sentinel = redis_client(both).connection_pool.sentinel_manager.sentinels[0]  # type: ignore[attr-defined]
    assert sentinel.connection_pool.connection_class is redis.SSLConnection


def test_check_names_the_primary_the_sentinels_give(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = RedisSettings.model_validate(SENTINELS)
    monkeypatch.setattr(redis_check, "sentinel_primary", lambda s: ("10.0.3.7", 6380))
    (line,) = check_sentinel(settings)
    assert line.ok
    assert line.text() == (
        "ok: redis sentinel: service 'features': primary 10.0.3.7:6380 "
        "(asked s1:26379, [::1]:26380)"
    )


def test_check_fails_with_the_sentinels_answers_when_none_names_a_primary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_primary(settings: RedisSettings) -> tuple[str, int]:
        raise MasterNotFoundError("No master found for 'features' : ['s1:26379 - refused']")

    monkeypatch.setattr(redis_check, "sentinel_primary", no_primary)
    (line,) = check_sentinel(RedisSettings.model_validate(SENTINELS))
    assert not line.ok
    assert "names a primary for service 'features'" in line.detail
    assert "s1:26379 - refused" in line.detail


def test_check_has_no_sentinel_line_without_sentinels() -> None:
    assert check_sentinel(RedisSettings()) == []


def _spec() -> Any:
    from worker.config import FeatureSpec

    return FeatureSpec(fields=["a"])

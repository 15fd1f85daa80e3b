"""No secret reaches a message, a traceback or ``check --print-config``.

A Redis password with an unencoded ``/``, ``?`` or ``#`` used to reach the output
through redis-py's URL parsing; librdkafka options such as ``sasl.oauthbearer.config``
were printed as written.
"""

from __future__ import annotations

import socket
import traceback
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr
from redis.connection import parse_url

from worker.config import (
    LIBRDKAFKA_SECRET_OPTIONS,
    FeatureSpec,
    RedisSettings,
    parse_config,
    redacted,
    redis_url_problem,
)
from worker.errors import ConfigError, FeatureStoreError
from worker.features.redis_io import redis_client
from worker.features.stores import RedisHashStore

PASSWORD = "vK7qZ/mW3xR#tY8pL?nB2c"
"""A password with every character that ends a URL's host part, in distinct pieces."""

Raw = dict[str, Any]


def fragments(secret: str, size: int = 4) -> set[str]:
    """Every piece of ``secret`` long enough to give it away."""
    return {secret[i : i + size] for i in range(len(secret) - size + 1)} | {secret}


def assert_hidden(text: str, *secrets: str) -> None:
    for secret in secrets:
        leaked = sorted(f for f in fragments(secret) if f in text)
        assert not leaked, f"{leaked} of a secret in: {text}"


def full_report(exc: BaseException) -> str:
    """What a log handler or an uncaught-exception hook would print, chain included."""
    return "".join(traceback.format_exception(exc))


def assert_clean_config_error(exc: ConfigError, *secrets: str) -> None:
    msg = str(exc)
    assert "redis.url" in msg
    assert "percent-encode" in msg.lower()
    assert "redis.password" in msg
    assert exc.__cause__ is None
    assert exc.__context__ is None  # not even a suppressed one holds the URL
    assert_hidden(full_report(exc), *secrets)


@pytest.fixture
def make_raw(tmp_path: Path) -> Callable[..., Raw]:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")

    def make(**redis_settings: Any) -> Raw:
        return {
            "redis": redis_settings,
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

    return make


# --- URLs redis-py would misread -------------------------------------------------------

# name -> (url, [the password as written, other secrets that must not show])
MISREAD: dict[str, tuple[str, list[str]]] = {
    "slash hash question": (f"redis://:{PASSWORD}@127.0.0.1:6379/0", [PASSWORD]),
    "slash": ("redis://:vK7qZ/mW3xR@127.0.0.1:6379/0", ["vK7qZ/mW3xR"]),
    "question": ("redis://:vK7qZ?mW3xR@127.0.0.1:6379/0", ["vK7qZ?mW3xR"]),
    "hash": ("redis://:vK7qZ#mW3xR@127.0.0.1:6379/0", ["vK7qZ#mW3xR"]),
    # digits before the '/': redis-py takes them for the port and raises nothing
    "numeric start": ("redis://:48213/mW3xR@127.0.0.1:6379/0", ["48213/mW3xR"]),
    # and with a user name it takes the user name for the host
    "user and numeric start": ("redis://svcuser:48213/mW3xR@127.0.0.1:6379/0", ["48213/mW3xR"]),
    "tls": ("rediss://svcuser:vK7qZ/mW3xR@cache.internal:6380/0", ["vK7qZ/mW3xR"]),
    "unix socket": ("unix://:vK7qZ/mW3xR@/run/redis.sock", ["vK7qZ/mW3xR"]),
    # urllib's own ValueError quotes what is between the brackets
    "brackets": ("redis://:vK7q[ZmW3]xR@127.0.0.1:6379/0", ["vK7q[ZmW3]xR"]),
    # ... and the whole host part when NFKC makes a delimiter of a character
    "fullwidth solidus": ("redis://:vK7qZ\uff0fmW3xR@127.0.0.1:6379/0", ["vK7qZ\uff0fmW3xR"]),
    # urllib silently drops tabs and line breaks: AUTH would get another password
    "tab": ("redis://:vK7qZ\tmW3xR@127.0.0.1:6379/0", ["vK7qZ\tmW3xR"]),
}


@pytest.mark.parametrize("name", sorted(MISREAD))
def test_redis_py_alone_leaks_or_misreads(name: str) -> None:
    """The premise: redis-py either raises an error quoting part of the password or
    reads another password (and often host or port) than the one written."""
    url, (secret, *_) = MISREAD[name]
    try:
        kwargs = parse_url(url)
    except ValueError as exc:
        assert fragments(secret) & {str(exc)[i : i + 4] for i in range(len(str(exc)))}
    else:
        assert kwargs.get("password") != secret


@pytest.mark.parametrize("name", sorted(MISREAD))
def test_misread_url_is_refused_at_load_without_quoting_it(
    make_raw: Callable[..., Raw], name: str
) -> None:
    url, secrets = MISREAD[name]
    assert redis_url_problem(url) is not None
    with pytest.raises(ConfigError) as info:
        parse_config(make_raw(url=url), environ={})
    assert_clean_config_error(info.value, *secrets)


@pytest.mark.parametrize("name", sorted(MISREAD))
def test_redis_client_refuses_a_misread_url_built_in_code(name: str) -> None:
    url, secrets = MISREAD[name]
    with pytest.raises(ConfigError) as info:
        redis_client(RedisSettings(url=SecretStr(url)))
    assert_clean_config_error(info.value, *secrets)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:vK7qZmW3xR@127.0.0.1:99999/0", "port"),
        ("redis://:vK7qZmW3xR@127.0.0.1:0/0", "port"),
        ("redis://:vK7qZmW3xR@127.0.0.1:63x9/0", "port"),
        ("redis://:vK7qZmW3xR@127.0.0.1:6379/zero", "database number"),
        ("http://:vK7qZmW3xR@127.0.0.1:6379/0", "redis://"),
        ("REDIS://:vK7qZmW3xR@127.0.0.1:6379/0", "redis://"),
    ],
)
def test_other_unusable_urls_name_the_problem(
    make_raw: Callable[..., Raw], url: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(make_raw(url=url), environ={})
    assert problem in str(info.value)
    assert_clean_config_error(info.value, "vK7qZmW3xR")


def test_url_from_url_file_is_checked_and_named(
    make_raw: Callable[..., Raw], tmp_path: Path
) -> None:
    secret_file = tmp_path / "redis-url"
    secret_file.write_text(f"redis://:{PASSWORD}@127.0.0.1:6379/0\n")
    with pytest.raises(ConfigError) as info:
        parse_config(make_raw(url_file=str(secret_file)), environ={}, source="w.toml")
    assert "w.toml: redis.url (read from redis.url_file)" in str(info.value)
    assert_clean_config_error(info.value, PASSWORD)


def test_url_from_environment_is_checked(make_raw: Callable[..., Raw]) -> None:
    env = {"STREAMFER_REDIS__URL": f"redis://:{PASSWORD}@127.0.0.1:6379/0"}
    with pytest.raises(ConfigError) as info:
        parse_config(make_raw(), environ=env)
    assert_clean_config_error(info.value, PASSWORD)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://cache",
        "redis://cache/",
        "redis://[::1]:6379/2",
        f"redis://:{urllib.parse.quote(PASSWORD, safe='')}@127.0.0.1:6379/0",
        f"rediss://svc:{urllib.parse.quote(PASSWORD, safe='')}@cache.internal:6380/1",
        "redis://:p@ss:w rd@127.0.0.1:6379/0",  # '@', ':' and ' ' are read as written
        "redis://127.0.0.1:6379?db=3&health_check_interval=10",
        "unix:///run/redis.sock?db=1",
    ],
)
def test_urls_redis_py_reads_as_written_are_accepted(
    make_raw: Callable[..., Raw], url: str
) -> None:
    cfg = parse_config(make_raw(url=url), environ={})
    assert cfg.redis.url.get_secret_value() == url
    client = redis_client(cfg.redis)
    client.close()


def test_percent_encoded_password_reaches_redis_py_decoded() -> None:
    """The fix the message suggests gives redis-py the password as it was."""
    url = f"redis://:{urllib.parse.quote(PASSWORD, safe='')}@127.0.0.1:6379/0"
    assert redis_url_problem(url) is None
    assert parse_url(url) == {"password": PASSWORD, "host": "127.0.0.1", "port": 6379, "db": 0}


def test_refused_query_argument_is_a_config_error_without_context() -> None:
    settings = RedisSettings(url=SecretStr("redis://:vK7qZmW3xR@127.0.0.1:6379/0?db=zero"))
    with pytest.raises(ConfigError) as info:
        redis_client(settings)
    assert "query arguments" in str(info.value)
    assert info.value.__context__ is None
    assert_hidden(full_report(info.value), "vK7qZmW3xR")


def test_client_repr_hides_the_password() -> None:
    url = f"redis://svc:{urllib.parse.quote(PASSWORD, safe='')}@127.0.0.1:6379/0"
    client = redis_client(RedisSettings(url=SecretStr(url), password=SecretStr("Zx9wQ4rT7y")))
    try:
        assert_hidden(repr(client) + repr(client.connection_pool), PASSWORD, "Zx9wQ4rT7y")
    finally:
        client.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("where", ["url", "password"])
def test_connection_refused_does_not_echo_the_password(where: str) -> None:
    port = closed_port()
    encoded = urllib.parse.quote(PASSWORD, safe="")
    if where == "url":
        settings = RedisSettings(url=SecretStr(f"redis://svc:{encoded}@127.0.0.1:{port}/0"))
    else:
        settings = RedisSettings(
            url=SecretStr(f"redis://127.0.0.1:{port}/0"), password=SecretStr(PASSWORD)
        )
    store = RedisHashStore.connect(settings, FeatureSpec(fields=["a"]))
    try:
        with pytest.raises(FeatureStoreError) as info:
            store.ping()
    finally:
        store.close()
    report = full_report(info.value)
    assert f"127.0.0.1:{port}" in report  # the error says where it tried
    assert_hidden(report, PASSWORD, encoded)


# --- check --print-config -----------------------------------------------------------

# Named here from librdkafka's CONFIGURATION.md rather than read from the constant, so
# that dropping one from worker.config fails this test.
SECRET_PROPERTIES = [
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.extensions",
    "sasl.kerberos.kinit.cmd",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.keystore.password",
    "ssl_engine_callback_data",
]
PLAIN_PROPERTIES = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.username": "svc-scorer",
    "ssl.ca.location": "/etc/ssl/ca.pem",
    "sasl.oauthbearer.method": "oidc",
    "enable.idempotence": True,
}


def test_every_documented_secret_property_is_in_the_constant() -> None:
    assert set(SECRET_PROPERTIES) <= LIBRDKAFKA_SECRET_OPTIONS


@pytest.mark.parametrize("section", ["options", "consumer_options", "producer_options"])
def test_print_config_masks_secret_librdkafka_options(
    make_raw: Callable[..., Raw], section: str
) -> None:
    secrets = {name: f"S{i:02d}qW8xZ3kP{i:02d}" for i, name in enumerate(SECRET_PROPERTIES)}
    oauth = "clientId=scorer clientSecret=oB7xQ2mZ9kW4 scope=infer"
    # a plug-in's option, say: its name says what it holds
    more = {"sasl.oauthbearer.token.endpoint.token": "tK5rU1nH8e", "x.Credentials": "Hq4nW7cE2v"}
    raw = make_raw(
        url=f"redis://:{urllib.parse.quote(PASSWORD, safe='')}@127.0.0.1:6379/0",
        password="Zx9wQ4rT7y",
    )
    options = {**secrets, "sasl.oauthbearer.config": oauth, **more, **PLAIN_PROPERTIES}
    raw["kafka"] = {section: options, "sasl_password": "Jm3vB8nC1x"}
    cfg = parse_config(raw, environ={})
    printed = orjson.dumps(redacted(cfg), option=orjson.OPT_INDENT_2).decode()
    assert_hidden(printed, PASSWORD, "Zx9wQ4rT7y", "Jm3vB8nC1x", "oB7xQ2mZ9kW4")
    assert_hidden(printed, *secrets.values(), *more.values())
    shown = redacted(cfg)
    assert all(shown["kafka"][section][name] == "**********" for name in [*secrets, *more])
    for name, value in PLAIN_PROPERTIES.items():
        assert shown["kafka"][section][name] == value
    assert shown["redis"]["url"] == "**********"
    assert shown["redis"]["password"] == "**********"
    assert shown["kafka"]["sasl_password"] == "**********"


@pytest.mark.parametrize("name", ["my.plugin.api.token", "SSL.Key.Password", "x.credentials"])
def test_names_that_say_secret_are_masked(make_raw: Callable[..., Raw], name: str) -> None:
    raw = make_raw()
    raw["kafka"] = {"producer_options": {name: "Hq4nW7cE2v"}}
    assert_hidden(orjson.dumps(redacted(parse_config(raw, environ={}))).decode(), "Hq4nW7cE2v")


def test_redacted_leaves_the_config_itself_intact(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    raw["kafka"] = {"options": {"sasl.oauthbearer.config": "clientSecret=oB7xQ2mZ9kW4"}}
    cfg = parse_config(raw, environ={})
    redacted(cfg)
    assert cfg.kafka.options["sasl.oauthbearer.config"] == "clientSecret=oB7xQ2mZ9kW4"


def test_redis_settings_dumps_hide_the_url() -> None:
    settings = RedisSettings(url=SecretStr(f"redis://:{PASSWORD}@h:6379/0"))
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert_hidden(text, PASSWORD)

"""Secrets through the command line: ``streamfer check`` against a redis-server whose
password holds ``/``, ``#`` and ``?``, and ``--print-config`` with OAuth options.

Nothing here needs Kafka (``check`` loads the models and pings Redis only); the
password-protected redis-server is started by this module on a free port.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from streamfer_dev.harness import worker_config_toml
from streamfer_dev.modelgen import DemoModel
from streamfer_dev.stack import free_port
from tests.integration.helpers import clean_env, streamfer

pytestmark = pytest.mark.integration

PASSWORD = "vK7qZ/mW3xR#tY8pL?nB2c"
OAUTH_SECRET = "oB7xQ2mZ9kW4"
ENCODED = urllib.parse.quote(PASSWORD, safe="")


def fragments(secret: str, size: int = 4) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def assert_hidden(proc: subprocess.CompletedProcess[str], *secrets: str) -> None:
    out = proc.stdout + proc.stderr
    for secret in secrets:
        leaked = sorted(f for f in fragments(secret) if f in out)
        assert not leaked, f"{leaked} of a secret in:\n{out}"


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[int]:
    """A redis-server on a free port that wants ``PASSWORD``; stopped by its PID."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not installed")
    port = free_port()
    work = tempfile.mkdtemp(prefix="streamfer-redis-auth-")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", work, "--requirepass", PASSWORD]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=1)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    assert client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()
        yield port
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(work, ignore_errors=True)


def write(
    tmp_path: Path,
    model: DemoModel,
    redis_url: str,
    redis_lines: str = "",
    kafka_extra: str = "",
) -> Path:
    """A one-pipeline config; ``redis_lines`` go into its ``[redis]`` table."""
    text = worker_config_toml(
        bootstrap="127.0.0.1:9",  # nothing there: these checks skip Kafka or fail before it
        redis_url=redis_url,
        group="g",
        request_topic="req",
        result_topic="res",
        dead_letter_topic="dlq",
        model_path=model.path,
        fields=model.fields,
        kafka_extra=kafka_extra,
    )
    text = text.replace("[redis]\n", f"[redis]\n{redis_lines}\n", 1)
    path = tmp_path / "worker.toml"
    path.write_text(text)
    return path


def toml_string(value: str) -> str:
    return orjson.dumps(value).decode()


OAUTH_OPTIONS = (
    "options = { "
    f'"sasl.oauthbearer.config" = "clientId=scorer clientSecret={OAUTH_SECRET}" }}\n'
    "producer_options = { "
    f'"sasl.oauthbearer.client.secret" = "{OAUTH_SECRET}", "ssl.key.password" = "{PASSWORD}" }}\n'
)


# --- the password works when redis-py is given it as written --------------------------


@pytest.mark.parametrize("how", ["redis.password", "redis.password_file", "environment"])
def test_password_with_reserved_characters_works_outside_the_url(
    tmp_path: Path, model: DemoModel, locked_redis: int, how: str
) -> None:
    url = f"redis://127.0.0.1:{locked_redis}/0"
    env = clean_env()
    if how == "redis.password":
        path = write(tmp_path, model, url, f"password = {toml_string(PASSWORD)}")
    elif how == "redis.password_file":
        (tmp_path / "redis-password").write_text(PASSWORD + "\n")
        path = write(tmp_path, model, url, 'password_file = "redis-password"')
    else:
        path = write(tmp_path, model, url)
        env = clean_env(STREAMFER_REDIS__PASSWORD=PASSWORD)
    proc = streamfer("check", "--config", str(path), "--print-config", "--skip-kafka", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ok: pipeline demo" in proc.stdout
    assert_hidden(proc, PASSWORD)


def test_percent_encoded_url_works(tmp_path: Path, model: DemoModel, locked_redis: int) -> None:
    path = write(tmp_path, model, f"redis://:{ENCODED}@127.0.0.1:{locked_redis}/0")
    proc = streamfer(
        "check", "--config", str(path), "--print-config", "--skip-kafka", env=clean_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert_hidden(proc, PASSWORD, ENCODED)


def test_without_the_password_check_fails(
    tmp_path: Path, model: DemoModel, locked_redis: int
) -> None:
    """The server does want the password: the successes above are not a fluke."""
    path = write(tmp_path, model, f"redis://127.0.0.1:{locked_redis}/0")
    proc = streamfer("check", "--config", str(path), env=clean_env())
    assert proc.returncode == 2
    assert "Redis" in proc.stderr


# --- and fails, naming the field and hiding the password, in the URL as written ----------


def test_unencoded_url_exits_2_without_leaking(
    tmp_path: Path, model: DemoModel, locked_redis: int
) -> None:
    path = write(
        tmp_path,
        model,
        f"redis://:{PASSWORD}@127.0.0.1:{locked_redis}/0",
        kafka_extra=OAUTH_OPTIONS,
    )
    proc = streamfer("check", "--config", str(path), "--print-config", env=clean_env())
    assert proc.returncode == 2
    assert "redis.url" in proc.stderr
    assert "Percent-encode" in proc.stderr
    assert "redis.password" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""  # refused at load, before anything is printed
    assert_hidden(proc, PASSWORD, OAUTH_SECRET)


def test_unencoded_url_from_the_environment_exits_2_without_leaking(
    tmp_path: Path, model: DemoModel
) -> None:
    path = write(tmp_path, model, "redis://127.0.0.1:6379/0")
    env = clean_env(STREAMFER_REDIS__URL=f"redis://svc:{PASSWORD}@127.0.0.1:6379/0")
    proc = streamfer("check", "--config", str(path), env=env)
    assert proc.returncode == 2
    assert "redis.url" in proc.stderr
    assert_hidden(proc, PASSWORD)


def test_print_config_masks_secrets_and_refused_connection_hides_them(
    tmp_path: Path, model: DemoModel
) -> None:
    port = free_port()  # nothing listens there
    path = write(
        tmp_path,
        model,
        f"redis://svc:{ENCODED}@127.0.0.1:{port}/0",
        kafka_extra=OAUTH_OPTIONS + f'sasl_password = "{OAUTH_SECRET}x"\n',
    )
    proc = streamfer("check", "--config", str(path), "--print-config", env=clean_env())
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in proc.stderr  # the connection error says where
    assert_hidden(proc, PASSWORD, ENCODED, OAUTH_SECRET)
    printed = orjson.loads(proc.stdout)
    kafka = printed["kafka"]
    assert kafka["options"]["sasl.oauthbearer.config"] == "**********"
    assert kafka["producer_options"]["sasl.oauthbearer.client.secret"] == "**********"
    assert kafka["producer_options"]["ssl.key.password"] == "**********"
    assert kafka["sasl_password"] == "**********"
    assert printed["redis"]["url"] == "**********"
    assert kafka["bootstrap_servers"] == "127.0.0.1:9"  # the rest is shown


def test_wrong_password_is_not_echoed(tmp_path: Path, model: DemoModel, locked_redis: int) -> None:
    wrong = "Wq8/zX3#kL5?mN7"
    path = write(
        tmp_path,
        model,
        f"redis://127.0.0.1:{locked_redis}/0",
        f"password = {toml_string(wrong)}",
    )
    proc = streamfer("check", "--config", str(path), env=clean_env())
    assert proc.returncode == 2
    assert "Redis" in proc.stderr
    assert_hidden(proc, wrong, PASSWORD)

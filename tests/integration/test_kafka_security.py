"""streamfer against a broker that wants credentials: SASL_SSL with SCRAM-SHA-512 (a user
created when the broker's storage is formatted) and mutual TLS (a client certificate
signed by the test's private CA). The worker, check, offsets and replay connect with
only their config; the test's own producer and reader use the broker's PLAINTEXT
listener."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from streamfer_dev.harness import (
    collect_outcomes,
    end_offsets,
    produce_requests,
    worker_config_toml,
)
from streamfer_dev.modelgen import DemoModel
from streamfer_dev.stack import SecuredListeners, Service, start_kafka
from tests.integration.helpers import assert_committed_to_end, clean_env, streamfer
from tests.integration.tls import Certificates, make_certificates, sign
from worker.kafka.topics import ensure_topics

pytestmark = pytest.mark.integration

USER, PASSWORD = "scorer", "scram-Pa55/word#?"


@dataclass(frozen=True)
class Secured:
    kafka: Service
    listeners: SecuredListeners
    certs: Certificates
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("kafka-tls")
    certs = make_certificates(directory)
    client_cert, client_key = sign(directory, certs.ca, certs.ca_key, "streamfer-worker")
    listeners = SecuredListeners(certs.ca, certs.cert, certs.key, {USER: PASSWORD})
    kafka = start_kafka(secured=listeners, heap_mb=512)
    try:
        yield Secured(kafka, listeners, certs, client_cert, client_key)
    finally:
        kafka.stop()


def _kafka_lines(s: Secured, how: str, password_file: Path | None = None) -> tuple[str, str]:
    """The bootstrap address and the [kafka] lines of a config for listener ``how``."""
    if how == "sasl":
        options = (
            f'options = {{ "security.protocol" = "SASL_SSL", "sasl.mechanism" = '
            f'"SCRAM-SHA-512", "ssl.ca.location" = "{s.certs.ca}" }}\n'
        )
        lines = f'{options}sasl_username = "{USER}"\nsasl_password_file = "{password_file}"\n'
        return f"127.0.0.1:{s.listeners.ports['SASL_SSL']}", lines
    options = (
        f'options = {{ "security.protocol" = "SSL", "ssl.ca.location" = "{s.certs.ca}", '
        f'"ssl.certificate.location" = "{s.client_cert}", '
        f'"ssl.key.location" = "{s.client_key}" }}\n'
    )
    return f"127.0.0.1:{s.listeners.ports['SSL']}", options


def _setup(
    s: Secured, model: DemoModel, redis_url: str, tmp_path: Path, tag: str, how: str
) -> tuple[Path, dict[str, str], set[str], list[str]]:
    topics = {"req": f"sec-req-{tag}", "res": f"sec-res-{tag}", "dlq": f"sec-dlq-{tag}"}
    ensure_topics(s.kafka.address, [(t, 2) for t in topics.values()])
    secret = tmp_path / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    bootstrap, lines = _kafka_lines(s, how, secret)
    config = tmp_path / "worker.toml"
    config.write_text(
        worker_config_toml(
            bootstrap=bootstrap,
            redis_url=redis_url,
            group=f"sec-{tag}",
            request_topic=topics["req"],
            result_topic=topics["res"],
            dead_letter_topic=topics["dlq"],
            model_path=model.path,
            fields=model.fields,
            kafka_extra=lines,
        )
    )
    return config, topics, set(), []


@pytest.mark.parametrize("how", ["sasl", "mtls"])
def test_worker_check_offsets_and_replay_connect_with_only_config(
    secured: Secured,
    model: DemoModel,
    redis_url: str,
    entities: list[str],
    tmp_path: Path,
    how: str,
) -> None:
    s = secured
    config, topics, _, _ = _setup(s, model, redis_url, tmp_path, how, how)
    ids = {f"{how}{i}" for i in range(200)}
    produce_requests(
        s.kafka.address,
        topics["req"],
        [
            (rid, None, orjson.dumps({"id": rid, "entity": entities[n % 40]}))
            for n, rid in enumerate(sorted(ids))
        ],
    )
    env = clean_env()
    check = streamfer("check", "--config", str(config), env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok: producer: connects" in check.stdout

    run = streamfer("run", "--config", str(config), "--burst-idle-s", "3", env=env, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert PASSWORD not in run.stderr
    outcomes = collect_outcomes(s.kafka.address, topics["res"], topics["dlq"], ids, timeout=60)
    assert outcomes.lost(ids) == []
    assert_committed_to_end(s.kafka.address, f"sec-{how}", topics["req"])

    shown = streamfer("offsets", "show", "--config", str(config), "--json", env=env)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert orjson.loads(shown.stdout)["lag"] == 0

    state = ["--state-dir", str(tmp_path / "replays")]
    replay = streamfer("replay", "--config", str(config), *state, "--json", env=env)
    assert replay.returncode == 0, replay.stderr[-3000:]
    summary = orjson.loads(replay.stdout.strip().splitlines()[-1])
    assert (summary["records"], summary["results"], summary["lost"]) == (200, 200, 0)
    replayed = end_offsets(s.kafka.address, f"{topics['res']}.replay.1")
    assert sum(replayed.values()) == 200


def test_a_wrong_scram_password_fails_check_naming_the_authentication(
    secured: Secured, model: DemoModel, redis_url: str, tmp_path: Path
) -> None:
    config, _, _, _ = _setup(secured, model, redis_url, tmp_path, "wrong", "sasl")
    (tmp_path / "kafka-password").write_text("not-the-password\n")
    proc = streamfer("check", "--config", str(config), "--kafka-timeout", "5", env=clean_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL: kafka:" in proc.stdout
    assert "SASL authentication error" in proc.stdout, proc.stdout
    assert "not-the-password" not in proc.stdout + proc.stderr


def test_a_client_without_a_certificate_is_refused_by_the_mtls_listener(
    secured: Secured, model: DemoModel, redis_url: str, tmp_path: Path
) -> None:
    config, _, _, _ = _setup(secured, model, redis_url, tmp_path, "nocert", "mtls")
    text = config.read_text()
    text = text.replace(f', "ssl.certificate.location" = "{secured.client_cert}"', "")
    config.write_text(text.replace(f', "ssl.key.location" = "{secured.client_key}"', ""))
    proc = streamfer("check", "--config", str(config), "--kafka-timeout", "5", env=clean_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL: kafka:" in proc.stdout

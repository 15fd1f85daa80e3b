"""A worker started while Kafka is unreachable: its probes answer at once, /readyz says
the brokers are the reason, librdkafka's errors come through the worker's own log
format a few times instead of every 50 ms, and it stops cleanly on SIGTERM; once the
broker is there, it joins and becomes ready."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from streamfer_dev.harness import WorkerProcess, wait_for_assignment
from streamfer_dev.stack import free_port
from tests.conftest import Topics

pytestmark = pytest.mark.integration


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _wait(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def _port(worker: WorkerProcess) -> int | None:
    found = re.findall(r"/readyz on http://127\.0\.0\.1:(\d+)", worker.log_text())
    return int(found[-1]) if found else None


def test_kafka_unreachable_is_said_once_in_a_while_and_by_readyz(
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    t = fresh_topics(1)
    metrics = '[metrics]\nhost = "127.0.0.1"\nport = 0\n'
    path = write_config(t, extra=metrics, top='log_format = "json"\n')
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    path.write_text(path.read_text().replace(kafka_bootstrap, dead))
    worker = WorkerProcess(path, tmp_path / "down.log").start()
    try:
        assert _wait(lambda: _port(worker) is not None, 30), worker.log_text()[-2000:]
        port = _port(worker)
        assert port is not None
        status, body = _get(port, "/readyz")
        assert status == 503
        assert "Kafka broker" in body, body
        assert _wait(lambda: _get(port, "/healthz")[0] == 200, 30)  # models loaded
        # start-up gives up on the topics' metadata after its timeouts, then the loop runs
        assert _wait(lambda: ": group " in worker.log_text(), 90), worker.log_text()[-3000:]
        time.sleep(12)  # librdkafka alone would have printed ~240 lines by now
        assert worker.alive(), worker.log_text()[-3000:]
        status, body = _get(port, "/readyz")
        assert status == 503 and "Kafka broker" in body, body
    finally:
        code = worker.terminate()
    lines = worker.log_text().splitlines()
    assert code == 0, "\n".join(lines[-30:])
    assert not [ln for ln in lines if ln.startswith("%")], "librdkafka wrote to stderr itself"
    refused = [ln for ln in lines if "Connection refused" in ln]
    # about a minute of librdkafka's 20 a second per client, and its error callbacks:
    # each kind of line once per 30 s, with a count of the ones held back
    assert 1 <= len(refused) <= 24, refused
    for line in lines:
        doc = orjson.loads(line)  # JSON lines only, librdkafka's included
        assert {"level", "logger", "msg"} <= set(doc), line
    assert any(orjson.loads(ln)["logger"] == "streamfer.kafka" for ln in refused)


def test_ready_once_the_broker_answers(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path], tmp_path: Path
) -> None:
    t = fresh_topics(1)
    path = write_config(t, extra='[metrics]\nhost = "127.0.0.1"\nport = 0\n')
    worker = WorkerProcess(path, tmp_path / "up.log").start()
    try:
        wait_for_assignment([worker], 1, timeout=60)
        port = _port(worker)
        assert port is not None
        assert _wait(lambda: _get(port, "/readyz") == (200, "ready\n"), 30)
    finally:
        assert worker.terminate() == 0

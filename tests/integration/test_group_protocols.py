"""KIP-848's consumer group protocol (``[kafka] group_protocol = "consumer"``) serves as
the classic one does: two workers share the partitions in both delivery modes, a killed
worker's partitions move to the other, and a static member's replacement takes its place.
The broker (``start_kafka``) sets the protocol's session timeout to 10 s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from streamfer_dev.demo import make_requests
from streamfer_dev.harness import (
    Outcomes,
    WorkerProcess,
    collect_outcomes,
    committed_offsets,
    end_offsets,
    produce_requests,
    wait_for_assignment,
)
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, streamfer, wait_committed_to_end

pytestmark = pytest.mark.integration

READ_COMMITTED = {"isolation.level": "read_committed"}


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_two_workers_on_the_consumer_protocol_answer_every_request_once(
    delivery: str,
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(4)
    config = write_config(
        t, max_batch_size=64, group_protocol="consumer", top=f'delivery = "{delivery}"'
    )
    requests, good, _ = make_requests(3_000, entities, 0.0, seed=31)
    workers = [WorkerProcess(config, tmp_path / f"worker-{i}.log").start() for i in range(2)]
    try:
        wait_for_assignment(workers, 4, timeout=60)
        produce_requests(kafka_bootstrap, t.requests, requests, rate=1500)
        outcomes = collect_outcomes(
            kafka_bootstrap,
            t.results,
            t.dead_letters,
            good,
            timeout=90,
            consumer_options=READ_COMMITTED,
        )
    finally:
        codes = [w.terminate() for w in workers]
    logs = "\n".join(w.log_text()[-3000:] for w in workers)
    assert codes == [0, 0], logs
    assert outcomes.lost(good) == [], logs
    assert outcomes.duplicates() == 0, logs
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_killed_member_on_the_consumer_protocol_is_replaced(
    static: bool,
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """SIGKILL one of two workers mid-stream and start its replacement at once, restarted
    whenever it exits, as a supervisor would. Static, it takes the killed one's
    ``group_instance_id``: under this protocol the broker refuses it while the dead
    member's session lasts, so it stops with a message saying so, and a restart after that
    session expired joins. Either way nothing is lost and the replacement serves."""
    t = fresh_topics(4)
    config = write_config(t, max_batch_size=64, max_wait_ms=10, group_protocol="consumer")

    def worker(name: str, slot: int) -> WorkerProcess:
        env = {"STREAMFER_KAFKA__GROUP_INSTANCE_ID": f"slot-{slot}"} if static else {}
        return WorkerProcess(config, tmp_path / f"{name}.log", env=env).start()

    requests, good, _ = make_requests(6_000, entities, 0.0, seed=7)
    workers = [worker("worker-0", 0), worker("worker-1", 1)]
    producer = threading.Thread(
        target=produce_requests, args=(kafka_bootstrap, t.requests, requests), kwargs={"rate": 500}
    )
    replacements: list[WorkerProcess] = []
    try:
        wait_for_assignment(workers, 4, timeout=60)
        producer.start()
        time.sleep(3)
        workers[0].kill()
        replacements.append(worker("replacement-0", 0))
        deadline = time.monotonic() + 60
        while "; owning " not in replacements[-1].log_text():
            assert time.monotonic() < deadline, replacements[-1].log_text()[-3000:]
            if not replacements[-1].alive():
                time.sleep(2)  # the supervisor's first backoff is 1 s, doubling
                replacements.append(worker(f"replacement-{len(replacements)}", 0))
            time.sleep(0.2)
        producer.join(60)
        outcomes = collect_outcomes(
            kafka_bootstrap, t.results, t.dead_letters, good, timeout=90, outcomes=Outcomes()
        )
    finally:
        producer.join(60)
        codes = [w.terminate() for w in [workers[1], *replacements]]
    logs = "\n".join(w.log_text()[-3000:] for w in [*workers, *replacements])
    assert codes[0] == 0 and codes[-1] == 0, logs
    for refused in replacements[:-1]:  # static only: refused while the dead one's session ran
        assert static
        assert refused.process is not None and refused.process.returncode == 1, logs
        text = refused.log_text()
        assert "The instance ID is still used" in text, text[-3000:]
        assert "group.consumer.session.timeout.ms" in text, text[-3000:]
    assert outcomes.lost(good) == [], logs
    assert outcomes.duplicates() <= 2 * 4 * 64, outcomes.duplicates()
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def test_offsets_show_and_reset_a_stopped_consumer_protocol_group(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """``streamfer offsets`` reads and resets a group a consumer-protocol worker left (an
    empty group of type consumer), and refuses while that worker is a member."""
    t = fresh_topics(2)
    config = write_config(t, group_protocol="consumer")
    requests, good, _ = make_requests(200, entities, 0.0, seed=41)
    produce_requests(kafka_bootstrap, t.requests, requests)
    worker = WorkerProcess(config, tmp_path / "worker.log").start()
    try:
        wait_for_assignment([worker], 2, timeout=60)
        collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good, timeout=60)
        wait_committed_to_end(kafka_bootstrap, t.group, t.requests, timeout=30)
        busy = streamfer("offsets", "reset", "--config", str(config), "--to-earliest", "--yes")
        assert busy.returncode == 1 and "active members" in busy.stdout, busy.stdout
    finally:
        assert worker.terminate() == 0, worker.log_text()[-3000:]
    ends = end_offsets(kafka_bootstrap, t.requests)
    shown = streamfer("offsets", "show", "--config", str(config), "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert orjson.loads(shown.stdout)["lag"] == 0
    reset = streamfer("offsets", "reset", "--config", str(config), "--to-earliest", "--yes")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert committed_offsets(kafka_bootstrap, t.group, t.requests) == dict.fromkeys(ends, 0)

"""``streamfer run --processes 2`` against real Kafka and Redis: the supervisor's workers
serve the group, its merged /metrics and /readyz speak for both, a killed worker is
started again, a signal drains all, a killed supervisor leaves no worker behind, a bad
config stops at once, and two supervisors share a group as two hosts would."""

from __future__ import annotations

import http.client
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families

from streamfer_dev.demo import make_requests
from streamfer_dev.harness import WorkerProcess, collect_outcomes, produce_requests
from streamfer_dev.stack import free_port
from tests.conftest import Topics
from tests.integration.helpers import assert_committed_to_end, streamfer

pytestmark = pytest.mark.integration

TWO = ("--processes", "2")


def _metrics(port: int | str) -> str:
    return f'[metrics]\nhost = "127.0.0.1"\nport = {port}\n'


def _get(port: int, path: str) -> tuple[int | None, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError as exc:
        return None, str(exc)
    finally:
        conn.close()


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _per_process(
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    """One family's value summed per ``process`` label."""
    out: dict[str, float] = {}
    for (sample, labels), value in values.items():
        if sample == name:
            process = dict(labels)["process"]
            out[process] = out.get(process, 0.0) + value
    return out


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def _serving(port: int, supervisor: WorkerProcess, members: int = 2, partitions: int = 4) -> None:
    """Until /readyz says 200 and every worker owns partitions, all of them together."""

    def settled() -> bool:
        assert supervisor.alive(), supervisor.log_text()[-3000:]
        if _get(port, "/readyz")[0] != 200:
            return False
        owned = _per_process(_scrape(port), "streamfer_assigned_partitions")
        return len(owned) == members and all(owned.values()) and sum(owned.values()) == partitions

    assert _wait(settled, 90), (_get(port, "/readyz"), supervisor.log_text()[-3000:])


def _started(supervisor: WorkerProcess) -> dict[int, int]:
    """Process index -> pid of its latest start, from the supervisor's log."""
    found = re.findall(r"process (\d+) started: pid (\d+)", supervisor.log_text())
    return {int(index): int(pid) for index, pid in found}


def _gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_two_processes_serve_a_burst_of_requests_and_report_as_one(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """Produced once both own partitions, so that no rebalance makes a worker consume a
    record twice and the records counted add up to the requests exactly."""
    t = fresh_topics(4)
    port = free_port()
    config = write_config(t, max_batch_size=64, session_timeout_ms=6000, extra=_metrics(port))
    requests, good, bad_tags = make_requests(6000, entities, 0.01, seed=16)
    supervisor = WorkerProcess(config, tmp_path / "supervisor.log", args=TWO).start()
    try:
        assert _wait(lambda: _get(port, "/readyz")[0] == 503, 30)  # answers while starting
        _serving(port, supervisor)
        assert _get(port, "/healthz") == (200, "ok\n")
        positions = produce_requests(kafka_bootstrap, t.requests, requests)
        bad = {positions[tag] for tag in bad_tags}
        outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good, bad)

        def counted() -> bool:
            return sum(_per_process(_scrape(port), "streamfer_records_total").values()) >= len(
                requests
            )

        assert _wait(counted, 30)
        values = _scrape(port)
    finally:
        code = supervisor.terminate()
    log = supervisor.log_text()
    assert code == 0, log[-3000:]
    assert outcomes.lost(good, bad) == []
    assert outcomes.duplicates() == 0  # exactly one outcome each
    records = _per_process(values, "streamfer_records_total")
    assert set(records) == {"0", "1"} and all(records.values()), records
    assert sum(records.values()) == len(requests)
    assert _per_process(values, "streamfer_supervisor_process_up") == {"0": 1, "1": 1}
    assert values[("streamfer_supervisor_processes", ())] == 2
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)
    assert len(log.split("stopped cleanly")) == 3, log[-3000:]  # both workers drained


@dataclass
class _Stream:
    topics: Topics
    config: Path
    port: int
    supervisor: WorkerProcess
    producer: threading.Thread
    good: set[str]


@pytest.fixture
def stream(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> Iterator[Callable[[int, int], _Stream]]:
    """Factory: a supervisor of two workers, serving; requests produced at 2000/s on a
    thread; returned once ``first`` results came. Stopped (by PID) after the test."""
    made: list[_Stream] = []

    def start(records: int, first: int) -> _Stream:
        t = fresh_topics(4)
        port = free_port()
        config = write_config(
            t, max_batch_size=64, max_wait_ms=10, session_timeout_ms=6000, extra=_metrics(port)
        )
        requests, good, _ = make_requests(records, entities, 0.0, seed=records)
        supervisor = WorkerProcess(config, tmp_path / "supervisor.log", args=TWO).start()
        producer = threading.Thread(
            target=produce_requests,
            args=(kafka_bootstrap, t.requests, requests),
            kwargs={"rate": 2000},
        )
        made.append(_Stream(t, config, port, supervisor, producer, good))
        _serving(port, supervisor)
        producer.start()
        ids = {f"r{n}" for n in range(first)}
        partial = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, ids, timeout=60)
        assert len(partial.results) >= first
        return made[-1]

    yield start
    for s in made:
        if s.producer.ident is not None:
            s.producer.join(120)
        s.supervisor.kill()


def test_a_killed_worker_is_started_again_and_nothing_is_lost(
    kafka_bootstrap: str, stream: Callable[[int, int], _Stream]
) -> None:
    s = stream(12_000, 2000)
    t, port, supervisor = s.topics, s.port, s.supervisor
    victim = _started(supervisor)[1]
    os.kill(victim, signal.SIGKILL)  # mid-stream
    assert _wait(lambda: _started(supervisor)[1] != victim, 30), supervisor.log_text()[-3000:]
    assert _wait(lambda: _get(port, "/readyz")[0] == 200, 90), _get(port, "/readyz")
    restarts = _per_process(_scrape(port), "streamfer_supervisor_restarts_total")
    s.producer.join(120)
    assert not s.producer.is_alive()
    outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, s.good, timeout=120)
    code = supervisor.terminate()
    log = supervisor.log_text()
    assert code == 0, log[-3000:]
    assert restarts == {"0": 0, "1": 1}
    assert re.search(r"process 1 \(pid \d+\) exited after .* \(exit code -9: SIGKILL\)", log)
    assert outcomes.lost(s.good) == []
    # at-least-once: the killed worker's batches in flight, and commits still travelling
    assert outcomes.duplicates() <= 2 * 4 * 64, outcomes.duplicates()
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def test_sigterm_drains_every_worker_and_a_burst_run_finishes_the_rest(
    kafka_bootstrap: str, stream: Callable[[int, int], _Stream], tmp_path: Path
) -> None:
    s = stream(8000, 1000)
    t, supervisor = s.topics, s.supervisor
    workers = list(_started(supervisor).values())
    os.kill(supervisor.pid, signal.SIGTERM)  # mid-stream
    assert supervisor.process is not None
    code = supervisor.process.wait(60)
    log = supervisor.log_text()
    assert code == 0, log[-3000:]
    assert len(workers) == 2
    assert all(_gone(pid) for pid in workers), log[-3000:]
    assert len(re.findall(r"process \d \(pid \d+\) stopped: exit code 0", log)) == 2, log[-3000:]
    # What the drain committed is not served again: a burst run serves the rest, then ends.
    s.producer.join(120)
    burst = WorkerProcess(s.config, tmp_path / "burst.log", args=(*TWO, "--burst-idle-s", "3"))
    try:
        assert burst.start().process is not None
        assert burst.process.wait(120) == 0, burst.log_text()[-3000:]
    finally:
        burst.kill()
    outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, s.good, timeout=60)
    assert outcomes.lost(s.good) == []
    assert outcomes.duplicates() == 0
    assert "every worker process finished" in burst.log_text()
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)


def test_a_killed_supervisor_leaves_no_worker_behind(
    fresh_topics: Callable[..., Topics], write_config: Callable[..., Path], tmp_path: Path
) -> None:
    t = fresh_topics(2)
    port = free_port()
    config = write_config(t, session_timeout_ms=6000, extra=_metrics(port))
    supervisor = WorkerProcess(config, tmp_path / "supervisor.log", args=TWO).start()
    try:
        _serving(port, supervisor, partitions=2)
        workers = list(_started(supervisor).values())
        supervisor.kill()  # SIGKILL: no chance to stop anyone
        assert _wait(lambda: all(_gone(pid) for pid in workers), 60), supervisor.log_text()[-3000:]
    finally:
        for pid in _started(supervisor).values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    # the kernel's SIGTERM (PR_SET_PDEATHSIG) made each one drain and leave the group
    assert len(supervisor.log_text().split("stopped cleanly")) == 3, supervisor.log_text()[-3000:]


def test_a_bad_config_exits_2_at_once_without_starting_workers(
    tmp_path: Path, write_config: Callable[..., Path], fresh_topics: Callable[..., Topics]
) -> None:
    config = write_config(fresh_topics(1))
    config.write_text(config.read_text().replace("max_batch_size = 256", "max_batch_size = 0"))
    run = streamfer("run", "--config", str(config), *TWO, timeout=60)
    assert run.returncode == 2
    assert "pipelines[0].batch.max_batch_size" in run.stderr
    assert "started: pid" not in run.stderr


def test_a_model_that_does_not_fit_stops_the_supervisor_with_2_and_no_restarts(
    tmp_path: Path, write_config: Callable[..., Path], fresh_topics: Callable[..., Topics]
) -> None:
    # the config loads, but each worker finds the model wants 30 columns, not 2
    config = write_config(fresh_topics(1), extra=_metrics(free_port()))
    config.write_text(
        re.sub(r"\nfields = \[.*\]\n", '\nfields = ["f0", "f1"]\n', config.read_text())
    )
    started = time.monotonic()
    run = streamfer("run", "--config", str(config), *TWO, timeout=120)
    assert run.returncode == 2, run.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert "takes 30 columns but 2 features feed it" in run.stderr
    assert "refused its configuration (exit code 2): not restarting it" in run.stderr
    assert len(re.findall(r"process \d started", run.stderr)) == 2  # each started once
    assert "restarting it in" not in run.stderr


def test_two_supervisors_share_one_group_as_two_hosts(
    kafka_bootstrap: str,
    entities: list[str],
    fresh_topics: Callable[..., Topics],
    write_config: Callable[..., Path],
    tmp_path: Path,
) -> None:
    t = fresh_topics(8)
    # one config file; each host sets its metrics port and member id in its environment
    config = write_config(t, max_batch_size=64, session_timeout_ms=6000, extra=_metrics(9))
    ports = [free_port(), free_port()]
    hosts = [
        WorkerProcess(
            config,
            tmp_path / f"host-{name}.log",
            env={
                "STREAMFER_METRICS__PORT": str(port),
                "STREAMFER_KAFKA__GROUP_INSTANCE_ID": f"host-{name}",
            },
            args=TWO,
        ).start()
        for name, port in zip("ab", ports, strict=True)
    ]
    requests, good, _ = make_requests(6000, entities, 0.0, seed=19)
    try:

        def four_members() -> bool:
            if not all(_get(port, "/readyz")[0] == 200 for port in ports):
                return False
            owned = [_per_process(_scrape(p), "streamfer_assigned_partitions") for p in ports]
            return (
                all(len(o) == 2 and all(o.values()) for o in owned)
                and sum(sum(o.values()) for o in owned) == 8
            )

        assert _wait(four_members, 90), [h.log_text()[-2000:] for h in hosts]
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        group = admin.describe_consumer_groups([t.group])[t.group].result(timeout=10)
        instances = sorted(m.group_instance_id for m in group.members)
        positions = produce_requests(kafka_bootstrap, t.requests, requests)
        outcomes = collect_outcomes(kafka_bootstrap, t.results, t.dead_letters, good)
        assert len(positions) == len(requests)

        def counted() -> float:
            return sum(
                sum(_per_process(_scrape(p), "streamfer_records_total").values()) for p in ports
            )

        assert _wait(lambda: counted() >= len(requests), 30)
        total = counted()
    finally:
        codes = [h.terminate() for h in hosts]
    assert codes == [0, 0], [h.log_text()[-2000:] for h in hosts]
    # static members: each worker its own id, or two of them would fence each other
    assert instances == ["host-a-0", "host-a-1", "host-b-0", "host-b-1"]
    assert outcomes.lost(good) == [] and outcomes.duplicates() == 0
    assert total == len(requests)
    assert_committed_to_end(kafka_bootstrap, t.group, t.requests)

"""The merged /metrics, /readyz and /healthz of a supervisor's worker processes: merging
real worker registries' exposition text, the readiness and liveness rules, and the
endpoint itself in front of real worker probe servers on 127.0.0.1."""

from __future__ import annotations

import http.client
import socket
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from worker.compose import Metrics
from worker.ops import METRIC_NAMES
from worker.ops.health import HealthServer, HealthState, HttpEndpoint
from worker.ops.metrics_merge import (
    SUPERVISOR_METRIC_NAMES,
    Answer,
    MergedEndpoints,
    merge_expositions,
    merge_liveness,
    merge_readiness,
)
from worker.ops.supervisor import ChildState, ChildStatus, RestartPolicy, Supervisor, SupervisorPlan


def _worker_text(records: int, *, lag: int = 0) -> str:
    """A worker's real /metrics text after serving ``records`` records."""
    metrics = Metrics(CollectorRegistry())
    p = metrics.for_pipeline("demo")
    p.records.inc(records)
    p.results.inc(records)
    p.batches.inc()
    p.batch_size.observe(records)
    p.infer_seconds.observe(0.004)
    p.dead_letters.labels("demo", "invalid_json").inc()
    metrics.model_info.labels("demo", "m", "1", "ab" * 32, "CPUExecutionProvider").set(1)
    metrics.consumer_lag.labels("requests", "0").set(lag)
    metrics.assigned_partitions.set(2)
    return generate_latest(metrics.registry).decode()


def _render(families: list[object]) -> str:
    class Families:
        def collect(self) -> list[object]:
            return families

    registry = CollectorRegistry()
    registry.register(Families())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


Series = tuple[str, tuple[tuple[str, str], ...]]


def _series(text: str) -> list[Series]:
    return [
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _values(text: str) -> dict[Series, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_two_workers_merge_into_one_valid_exposition() -> None:
    families, readable = merge_expositions({0: _worker_text(3), 1: _worker_text(5, lag=7)})
    assert readable == {0: True, 1: True}
    text = _render(families)
    # one HELP and one TYPE per family, however many processes have it
    heads = Counter(tuple(line.split()[1:3]) for line in text.splitlines() if line[:1] == "#")
    assert set(heads.values()) == {1}, [k for k, n in heads.items() if n != 1]
    assert {kind for kind, _ in heads} == {"HELP", "TYPE"}
    series = _series(text)
    assert len(series) == len(set(series)), "duplicate series"
    assert all(dict(labels).get("process") in ("0", "1") for _, labels in series)
    values = _values(text)
    records = {k: v for k, v in values.items() if k[0] == "streamfer_records_total"}
    assert sorted(records.values()) == [3, 5]
    assert sum(records.values()) == 8
    lag = ("streamfer_consumer_lag", (("partition", "0"), ("process", "1"), ("topic", "requests")))
    assert values[lag] == 7
    # a histogram keeps its buckets, sum and count per process
    counts = [k for k in values if k[0] == "streamfer_batch_size_count"]
    assert sorted(dict(k[1])["process"] for k in counts) == ["0", "1"]
    names = {f.name for f in text_string_to_metric_families(text)}
    exported = {n.removesuffix("_total") for n in METRIC_NAMES}
    assert exported <= names


def test_a_child_label_called_process_is_kept_as_exported_process() -> None:
    text = '# TYPE odd gauge\nodd{process="main"} 1\n'
    families, _ = merge_expositions({4: text})
    (sample,) = families[0].samples
    assert sample.labels == {"exported_process": "main", "process": "4"}


def test_unreadable_text_drops_that_child_only() -> None:
    families, readable = merge_expositions({0: "this is { not prometheus", 1: _worker_text(2)})
    assert readable == {0: False, 1: True}
    series = _series(_render(families))
    assert series and all(dict(labels)["process"] == "1" for _, labels in series)


def test_a_family_of_another_type_is_not_mixed_in() -> None:
    families, _ = merge_expositions(
        {0: "# TYPE x gauge\nx 1\n", 1: "# TYPE x_total counter\nx_total 2\n"}
    )
    (family,) = families
    assert family.type == "gauge"
    assert [s.labels["process"] for s in family.samples] == ["0"]


def _child(index: int, state: ChildState = "running", exit_code: int | None = None) -> ChildStatus:
    return ChildStatus(index, state, 1000 + index if state == "running" else None, exit_code, 0)


def test_ready_when_every_child_is() -> None:
    answers = [(_child(0), Answer(200, b"ready\n")), (_child(1), Answer(200, b"ready\n"))]
    assert merge_readiness(answers, stopping=False) == (200, b"ready\n")
    assert merge_readiness(answers, stopping=True) == (503, b"stopping\n")


def test_not_ready_lists_each_child_with_its_reasons() -> None:
    answers = [
        (_child(0), Answer(503, b"not yet a member of the consumer group; stopping\n")),
        (_child(1), Answer(200, b"ready\n")),
        (_child(2, "restarting", -9), None),
        (_child(3), Answer(None, error="connection refused")),
        (_child(4, "done", 0), None),
    ]
    code, body = merge_readiness(answers, stopping=False)
    assert code == 503
    assert body.decode().splitlines() == [
        "process 0: not yet a member of the consumer group; stopping",
        "process 2: restarting (exit code -9: SIGKILL)",
        "process 3: not answering (connection refused)",
        "process 4: finished",
    ]


def test_liveness_waits_for_every_child_once_then_only_fails_on_a_stall() -> None:
    seen: set[int] = set()
    loading = Answer(503, b"loading models\n")
    ok = Answer(200, b"ok\n")

    def live(first: tuple[ChildStatus, Answer | None]) -> tuple[int, bytes]:
        return merge_liveness([first, (_child(1), ok)], seen)

    assert live((_child(0), loading)) == (503, b"loading models\n")
    assert live((_child(0), ok)) == (200, b"ok\n")
    # a child restarting, loading its model again or not answering yet is the
    # supervisor's business, not a reason to restart them all
    assert live((_child(0, "restarting", 1), None)) == (200, b"ok\n")
    assert live((_child(0), loading)) == (200, b"ok\n")
    assert live((_child(0), Answer(None, error="connection refused"))) == (200, b"ok\n")
    assert live((_child(0), Answer(503, b"loop stalled\n"))) == (503, b"process 0: loop stalled\n")


# -- the endpoint in front of real worker probe servers ------------------------------------


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def servers() -> Iterator[Callable[[HealthState, int], int]]:
    """Factory: a real worker probe server whose registry counted ``records``; its port."""
    started: list[HealthServer] = []

    def start(state: HealthState, records: int) -> int:
        metrics = Metrics(CollectorRegistry())
        metrics.for_pipeline("demo").records.inc(records)
        server = HealthServer(state, metrics.registry, "127.0.0.1", 0).start()
        started.append(server)
        return server.port

    yield start
    for server in started:
        server.stop()


def _supervisor_registry() -> CollectorRegistry:
    """The supervisor's own families, as a real Supervisor registers them."""
    plan = SupervisorPlan(3, ("true",), {}, True, None, 1.0, True, RestartPolicy())
    registry = CollectorRegistry()
    Supervisor(plan, registry)
    return registry


def test_the_merged_endpoint_answers_for_every_child(
    servers: Callable[[HealthState, int], int],
) -> None:
    ready = HealthState(models_loaded=True, joined=True, broker_ok=True)
    joining = HealthState(models_loaded=True, joined=False, broker_ok=True)
    ports = [servers(ready, 3), servers(joining, 4)]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]  # bound, never listening: connection refused
        children = [
            ChildStatus(0, "running", ports[0], None, 0),
            ChildStatus(1, "running", ports[1], None, 0),
            ChildStatus(2, "running", refused, 1, 1),
        ]
        merged = MergedEndpoints(lambda: children, _supervisor_registry(), stopping=lambda: False)
        endpoint = HttpEndpoint(merged.respond, "127.0.0.1", 0).start()
        try:
            status, text = _get(endpoint.port, "/metrics")
            readyz = _get(endpoint.port, "/readyz")
            healthz = _get(endpoint.port, "/healthz")
            children[2] = ChildStatus(2, "restarting", None, 1, 1)
            healthz_restarting = _get(endpoint.port, "/healthz")
            joining.joined = True
            ready_now = _get(endpoint.port, "/readyz")
        finally:
            endpoint.stop()
            merged.close()
    assert status == 200
    values = _values(text)
    records = [v for k, v in values.items() if k[0] == "streamfer_records_total"]
    assert sorted(records) == [3, 4]
    up = {dict(k[1])["process"]: v for k, v in values.items() if k[0] == SUPERVISOR_METRIC_NAMES[2]}
    assert up == {"0": 1, "1": 1, "2": 0}
    assert values[("streamfer_supervisor_processes", ())] == 3
    assert values[("streamfer_supervisor_restarts_total", (("process", "2"),))] == 0
    series = _series(text)
    assert len(series) == len(set(series))
    assert readyz == (
        503,
        "process 1: not yet a member of the consumer group\n"
        "process 2: not answering (connection refused)\n",
    )
    assert healthz == (503, "loading models\n")  # process 2 never answered
    assert healthz_restarting == (503, "loading models\n")  # and still has not
    assert ready_now == (503, "process 2: restarting (exit code 1)\n")
    assert merged.respond("/nope")[0] == 404


def test_a_child_that_never_answers_costs_the_scrape_timeout_only() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections (the kernel does), never answers
        children = [ChildStatus(0, "running", silent.getsockname()[1], None, 0)]
        merged = MergedEndpoints(
            lambda: children, CollectorRegistry(), stopping=lambda: False, timeout_s=0.3
        )
        try:
            code, body, _ = merged.respond("/readyz")
            _, text, _ = merged.respond("/metrics")
        finally:
            merged.close()
    assert code == 503
    assert body == b"process 0: not answering (no answer within 0.3s)\n"
    assert 'streamfer_supervisor_process_up{process="0"} 0.0' in text.decode()

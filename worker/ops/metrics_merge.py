"""One /metrics, /readyz and /healthz for all the worker processes of a supervisor.

Each child serves its own endpoints on 127.0.0.1; ``MergedEndpoints`` asks every running
child at once (``SCRAPE_TIMEOUT_S`` each, in parallel) whenever it is asked itself, so
what it answers is as fresh as the children's own answers.

- ``/metrics``: every child's families merged, one HELP and TYPE per family, each sample
  labelled ``process="<index>"`` (a child's own ``process`` label becomes
  ``exported_process``), plus the supervisor's families: ``SUPERVISOR_METRIC_NAMES``. A
  restarted child's counters start again from zero, which Prometheus reads as a counter
  reset of that process's series.
- ``/readyz``: 200 when every child answers 200; else 503 with a line per child that is
  not ready, ``process <i>: <its reasons>`` (``restarting (exit code c)`` between a crash
  and its restart).
- ``/healthz``: 503 ``loading models`` until every child has answered 200 once; then 200,
  unless a running child answers 503 (its loop stalled). A child that crashed is the
  supervisor's to restart, not a reason to restart the whole pod.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from worker.ops.supervisor import ChildStatus

__all__ = [
    "SCRAPE_TIMEOUT_S",
    "SUPERVISOR_METRIC_NAMES",
    "Answer",
    "MergedEndpoints",
    "merge_expositions",
    "merge_liveness",
    "merge_readiness",
]

SCRAPE_TIMEOUT_S = 2.0
"""How long one child's endpoint may take to answer; a probe waits little longer."""
SUPERVISOR_METRIC_NAMES = (
    "streamfer_supervisor_processes",
    "streamfer_supervisor_restarts_total",
    "streamfer_supervisor_process_up",
)
_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Answer:
    """What a child's endpoint said: its status and body, or why it said nothing."""

    status: int | None
    body: bytes = b""
    error: str | None = None

    def text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()


def merge_expositions(expositions: Mapping[int, str]) -> tuple[list[Metric], dict[int, bool]]:
    """The families of every child's exposition text (by process index), each sample with
    its ``process`` label; and whether each child's text could be read. A child whose
    family has another type than the first child's loses that family."""
    families: dict[str, Metric] = {}
    readable: dict[int, bool] = {}
    for index in sorted(expositions):
        try:
            parsed = list(text_string_to_metric_families(expositions[index]))
        except ValueError:
            readable[index] = False
            continue
        readable[index] = True
        process = str(index)
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            elif merged.type != family.type:
                continue
            for s in family.samples:
                labels = dict(s.labels)
                if "process" in labels:
                    labels["exported_process"] = labels.pop("process")
                labels["process"] = process
                merged.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
    return list(families.values()), readable


def merge_readiness(
    answers: Sequence[tuple[ChildStatus, Answer | None]], *, stopping: bool
) -> tuple[int, bytes]:
    """200 and ``ready`` when every child answered 200; else 503 and a line per child
    that is not ready. ``answers`` holds None for a child that was not asked (one that is
    not running)."""
    lines = ["stopping"] if stopping else []
    for child, answer in answers:
        why = _not_ready(child, answer)
        if why is not None:
            lines.append(f"process {child.index}: {why}")
    if not lines:
        return 200, b"ready\n"
    return 503, ("\n".join(lines) + "\n").encode()


def _not_ready(child: ChildStatus, answer: Answer | None) -> str | None:
    if child.state == "restarting":
        return f"restarting ({child.exit_text()})"
    if child.state == "done":
        return "finished"
    if child.state == "stopped" or answer is None:
        return f"stopped ({child.exit_text()})"
    if answer.status == 200:
        return None
    if answer.status is None:
        return f"not answering ({answer.error})"
    return answer.text() or f"HTTP {answer.status}"


def merge_liveness(
    answers: Sequence[tuple[ChildStatus, Answer | None]], seen_live: set[int]
) -> tuple[int, bytes]:
    """``/healthz`` of the children as one; ``seen_live`` (the indices that have answered
    200 once) is updated in place."""
    seen_live.update(c.index for c, a in answers if a is not None and a.status == 200)
    seen_live.update(c.index for c, _ in answers if c.state == "done")
    if any(c.index not in seen_live for c, _ in answers):
        return 503, b"loading models\n"
    # A child started again answers "loading models" for a while: not a stall.
    stalled = [
        f"process {c.index}: {a.text()}"
        for c, a in answers
        if a is not None and a.status == 503 and a.text().startswith("loop stalled")
    ]
    if stalled:
        return 503, ("\n".join(stalled) + "\n").encode()
    return 200, b"ok\n"


class _Families:
    """A collector of families gathered already."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


class MergedEndpoints:
    """The ``Respond`` function (``worker.ops.health.HttpEndpoint``) of a supervisor."""

    def __init__(
        self,
        children: Callable[[], Sequence[ChildStatus]],
        registry: CollectorRegistry,
        *,
        stopping: Callable[[], bool],
        timeout_s: float = SCRAPE_TIMEOUT_S,
        host: str = "127.0.0.1",
        threads: int = 16,
    ) -> None:
        self._children = children
        self._registry = registry
        self._stopping = stopping
        self._timeout_s = timeout_s
        self._host = host
        self._seen_live: set[int] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="streamfer-scrape")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def respond(self, path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            return 200, self._metrics(), CONTENT_TYPE_LATEST
        if path == "/readyz":
            code, body = merge_readiness(self._ask(path), stopping=self._stopping())
            return code, body, _TEXT
        if path == "/healthz":
            answers = self._ask(path)
            with self._lock:
                code, body = merge_liveness(answers, self._seen_live)
            return code, body, _TEXT
        return 404, b"not found\n", _TEXT

    def _ask(self, path: str) -> list[tuple[ChildStatus, Answer | None]]:
        """Every child with the answer of its endpoint ``path``, asked all at once."""
        children = self._children()
        futures = {
            c.index: self._pool.submit(self._get, c.port, path)
            for c in children
            if c.state == "running" and c.port is not None
        }
        return [(c, futures[c.index].result() if c.index in futures else None) for c in children]

    def _metrics(self) -> bytes:
        answers = self._ask("/metrics")
        texts = {
            c.index: a.body.decode("utf-8", "replace")
            for c, a in answers
            if a is not None and a.status == 200
        }
        families, readable = merge_expositions(texts)
        up = GaugeMetricFamily(
            "streamfer_supervisor_process_up",
            "1 when the worker process answered its /metrics for this scrape",
            labels=["process"],
        )
        for child, _ in answers:
            up.add_metric([str(child.index)], 1.0 if readable.get(child.index) else 0.0)
        registry = CollectorRegistry()
        registry.register(_Families([*families, up]))
        registry.register(self._registry)
        return generate_latest(registry)

    def _get(self, port: int | None, path: str) -> Answer:
        conn = http.client.HTTPConnection(self._host, port, timeout=self._timeout_s)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return Answer(response.status, response.read())
        except ConnectionRefusedError:
            return Answer(None, error="connection refused")
        except TimeoutError:
            return Answer(None, error=f"no answer within {self._timeout_s:g}s")
        except (OSError, http.client.HTTPException) as exc:
            return Answer(None, error=str(exc) or type(exc).__name__)
        finally:
            conn.close()

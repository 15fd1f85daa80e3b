"""Liveness, readiness and the HTTP endpoint that serves them with the metrics.

``HealthState`` is written by the worker's threads (single writers per field, so plain
attributes suffice) and read by the HTTP thread. ``/healthz`` answers 200 while the loop
keeps turning; ``/readyz`` answers 200 when the worker owns partitions (or is waiting
for an assignment in a group that has none for it), its models are loaded and the broker
and the feature store answer, else 503 with the reasons; ``/metrics`` is Prometheus text
from the worker's own registry.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["HealthServer", "HealthState"]


@dataclass
class HealthState:
    """What probes need to know; updated by the worker, read by the HTTP thread."""

    liveness_timeout_s: float = 60.0
    loop_turned_at: float = field(default_factory=time.monotonic)
    models_loaded: bool = False
    joined: bool = False
    broker_ok: bool = True
    feature_store_ok: bool = True
    stopping: bool = False

    def turned(self) -> None:
        self.loop_turned_at = time.monotonic()

    def live(self) -> bool:
        return time.monotonic() - self.loop_turned_at < self.liveness_timeout_s

    def not_ready_reasons(self) -> list[str]:
        reasons = []
        if not self.models_loaded:
            reasons.append("models not loaded")
        if not self.joined:
            reasons.append("not yet a member of the consumer group")
        if not self.broker_ok:
            reasons.append("Kafka brokers unreachable")
        if not self.feature_store_ok:
            reasons.append("feature store unreachable")
        if self.stopping:
            reasons.append("stopping")
        if not self.live():
            reasons.append("loop stalled")
        return reasons


class HealthServer:
    """Serves /metrics, /healthz and /readyz on a daemon thread."""

    def __init__(
        self, state: HealthState, registry: CollectorRegistry, host: str, port: int
    ) -> None:
        handler = _handler_for(state, registry)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="streamfer-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(state: HealthState, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = state.live()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"loop stalled\n")
            elif path == "/readyz":
                reasons = state.not_ready_reasons()
                body = ("ready\n" if not reasons else "; ".join(reasons) + "\n").encode()
                self._reply(503 if reasons else 200, body)
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would flood the log

    return Handler

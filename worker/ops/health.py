"""Liveness, readiness and the HTTP endpoint that serves them with the metrics.

``HealthState`` is written by the worker's threads (single writers per field, so plain
attributes suffice) and read by the HTTP thread. ``/healthz`` answers 200 while the loop
keeps turning (503 while the models load); ``/readyz`` answers 200 when the worker owns
partitions (or is waiting for an assignment in a group that has none for it), its models
are loaded and the broker and the feature store answer, else 503 with the reasons. A
pipeline whose model is at fault makes it 503 too, naming that pipeline, even while the
worker's other pipelines are served: readiness says whether the worker serves everything
it was configured for, so a rollout of a broken model version stops at its first pod and
an alert on readiness fires; nothing restarts a pod or takes it out of its group for
being not ready, so the other pipelines go on;
``/metrics`` is Prometheus text from the worker's own registry; with ``reload`` given
(``[metrics] reload_endpoint = true``, loopback hosts only), ``POST /reload`` asks the
worker to look for a new model version and answers 202 at once. ``HttpEndpoint`` is the
same bounded server answering from any ``Respond`` function (the supervisor of several
worker processes serves its merged endpoints with it).

The server spends a thread per connection, so connections are bounded in number and in
time: at most ``MAX_CONNECTIONS`` at once (more are closed unanswered, without a thread),
each read or write waits at most ``CONNECTION_TIMEOUT_S`` and a connection lives at most
``CONNECTION_DEADLINE_S``. Idle or trickling clients can then make probes fail for a
while, but cannot pile up threads in the worker.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self, TypedDict, Unpack

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from worker.core import Clock, monotonic_clock

__all__ = [
    "CONNECTION_DEADLINE_S",
    "CONNECTION_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "RELOAD_PATH",
    "HealthServer",
    "HealthState",
    "HttpEndpoint",
    "Respond",
    "reload_response",
]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 32
"""Connections served at once, one thread each. Probes and scrapes come a few a second."""
CONNECTION_TIMEOUT_S = 5.0
"""How long one read or write may wait: a request is a few hundred bytes sent at once,
so a connection silent this long is idle and is closed, freeing its thread."""
CONNECTION_DEADLINE_S = 30.0
"""How long a connection may stay open in all, so that a client sending a byte now and
then (which resets the per-read timeout) cannot keep its thread either."""
_POLL_S = 0.25
"""How often the accept loop checks for shutdown and for connections past their deadline."""
_TEXT = "text/plain; charset=utf-8"
RELOAD_PATH = "/reload"
_MAX_POST_BODY = 64 * 1024
"""A POST needs no body; a larger one than this is refused unread."""

Respond = Callable[[str], tuple[int, bytes, str]]
"""A request path (without the query) -> status, body and content type. Called on the
connection's thread, so it may block for a while (never longer than the probes wait)."""


@dataclass
class HealthState:
    """What probes need to know; updated by the worker, read by the HTTP thread. Liveness
    is judged on ``clock``."""

    liveness_timeout_s: float = 60.0
    loop_turned_at: float = field(init=False)
    models_loaded: bool = False
    joined: bool = False
    broker_ok: bool = False
    """Whether a broker answered: set by joining the group or by statistics showing a
    broker up, cleared when every broker is down or authentication fails."""
    broker_problem: str | None = None
    """The last error that made the brokers unusable, for /readyz."""
    feature_store_ok: bool = True
    feature_store_problem: str | None = None
    """Why the feature store is not usable, when something more specific than unreachable
    is known (Redis refuses this worker's user, say); shown by /readyz."""
    schema_registry_problem: str | None = None
    """Why the Schema Registry cannot give a batch its schemas, while it cannot."""
    model_problems: dict[str, str] = field(default_factory=dict)
    """Pipelines whose batches wait for a fault of their model, and why (the others are
    served meanwhile; any one makes the worker not ready)."""
    inference_server_problems: dict[str, str] = field(default_factory=dict)
    """Pipelines whose batches wait for the inference server that runs their model, and why."""
    stopping: bool = False
    stalled_call: str | None = None
    """A Kafka client call past its own timeout (``worker.kafka.call_watch``): the loop is
    stuck in it, so the worker is not live, however recently the loop last turned."""
    clock: Clock = field(default=monotonic_clock, repr=False)

    def __post_init__(self) -> None:
        self.loop_turned_at = self.clock()

    def turned(self) -> None:
        self.loop_turned_at = self.clock()

    def feature_store(self, ok: bool, problem: str | None = None) -> None:
        """The pipelines' ``on_feature_store`` callback: the store answers, or why not."""
        self.feature_store_problem = None if ok else problem
        self.feature_store_ok = ok

    def schema_registry(self, ok: bool, problem: str | None = None) -> None:
        """The pipelines' ``on_schema_registry`` callback: the registry answers, or why not."""
        self.schema_registry_problem = None if ok else (problem or "unreachable")

    def model_for(self, pipeline: str) -> Callable[[bool, str | None], None]:
        """A pipeline's ``on_model`` callback: its model takes batches, or why not."""

        def on_model(ok: bool, problem: str | None) -> None:
            if ok:
                self.model_problems.pop(pipeline, None)
            else:
                self.model_problems[pipeline] = problem or "the model fails"

        return on_model

    def inference_server_for(self, pipeline: str) -> Callable[[bool, str | None], None]:
        """A pipeline's ``on_inference_server`` callback: its server answers, or why not."""

        def on_server(ok: bool, problem: str | None) -> None:
            if ok:
                self.inference_server_problems.pop(pipeline, None)
            else:
                why = problem or "inference server unreachable"
                self.inference_server_problems[pipeline] = f"pipeline {pipeline}: {why}"

        return on_server

    def broker(self, ok: bool, problem: str | None = None) -> None:
        """A broker answered (``ok``), or why none can be used."""
        self.broker_ok = ok
        self.broker_problem = None if ok else problem

    def call_stalled(self, why: str | None) -> None:
        """``CallWatch``'s ``on_stall``: a call is past its timeout (``why``), or came back."""
        self.stalled_call = why

    def live(self) -> bool:
        if self.stalled_call is not None:
            return False
        return self.clock() - self.loop_turned_at < self.liveness_timeout_s

    def liveness_problem(self) -> str:
        """Why ``live()`` is false."""
        return self.stalled_call or "loop stalled"

    def not_ready_reasons(self) -> list[str]:
        reasons = []
        if not self.models_loaded:
            reasons.append("models not loaded")
        if not self.joined:
            reasons.append("not yet a member of the consumer group")
        if not self.broker_ok:
            problem = self.broker_problem
            why = f"Kafka brokers unreachable: {problem}" if problem else "no Kafka broker yet"
            reasons.append(why)
        if not self.feature_store_ok:
            problem = self.feature_store_problem
            reasons.append(f"feature store: {problem}" if problem else "feature store unreachable")
        if self.schema_registry_problem is not None:
            reasons.append(f"schema registry: {self.schema_registry_problem}")
        reasons.extend(list(self.model_problems.values()))  # a copy: another thread writes it
        reasons.extend(list(self.inference_server_problems.values()))
        if self.stopping:
            reasons.append("stopping")
        if not self.live():
            reasons.append(self.liveness_problem())
        return reasons


class HttpEndpoint:
    """Serves what ``respond`` answers on a daemon thread, a thread per connection for at
    most ``max_connections`` connections (see the module docstring). ``post`` answers
    POST requests; without it they get 501, as any other method."""

    def __init__(
        self,
        respond: Respond,
        host: str,
        port: int,
        *,
        post: Respond | None = None,
        max_connections: int = MAX_CONNECTIONS,
        connection_timeout_s: float = CONNECTION_TIMEOUT_S,
        connection_deadline_s: float = CONNECTION_DEADLINE_S,
    ) -> None:
        if max_connections < 1 or connection_timeout_s <= 0 or connection_deadline_s <= 0:
            raise ValueError("max_connections and the connection times must be positive")
        self._server = _BoundedHTTPServer(
            (host, port),
            _handler_for(respond, post, connection_timeout_s),
            max_connections=max_connections,
            deadline_s=connection_deadline_s,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_S},
            name="streamfer-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def open_connections(self) -> int:
        """Connections being served now (each holds a thread)."""
        return self._server.open_connections

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, then end the connections still open so their threads exit."""
        self._server.shutdown()
        self._server.server_close()
        self._server.end_connections(everyone=True)


class _Limits(TypedDict, total=False):
    max_connections: int
    connection_timeout_s: float
    connection_deadline_s: float


class HealthServer(HttpEndpoint):
    """Serves one worker's /metrics, /healthz and /readyz (limits as ``HttpEndpoint``'s),
    and ``POST /reload`` when ``reload`` is given (it only sets a flag)."""

    def __init__(
        self,
        state: HealthState,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        reload: Callable[[], str | None] | None = None,
        **limits: Unpack[_Limits],
    ) -> None:
        post = reload_response(reload) if reload is not None else None
        super().__init__(_worker_responses(state, registry), host, port, post=post, **limits)


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that admits at most ``max_connections`` at once and ends any
    connection ``deadline_s`` after it was accepted.

    ``verify_request`` (run in the accept loop) takes a slot or refuses; a refused socket
    is closed there and then, so no thread is started for it. ``shutdown_request`` (run
    when a connection is done, on its thread) gives the slot back before closing the
    socket, under the lock ``end_connections`` holds while it shuts sockets down, so a
    socket is never shut down after it was closed (its descriptor may be reused by then).
    """

    daemon_threads = True
    request_queue_size = 64
    """The listen backlog: HTTPServer's 5 makes a burst of probes wait for SYN retries
    (a second each), where accepting (or refusing) them takes microseconds."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int,
        deadline_s: float,
    ) -> None:
        self._max_connections = max_connections
        self._deadline_s = deadline_s
        self._lock = threading.Lock()
        self._open: dict[socket.socket, float] = {}  # socket -> deadline (monotonic)
        super().__init__(address, handler)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._lock:
            if len(self._open) >= self._max_connections:
                return False  # the caller closes it at once
            self._open[request] = time.monotonic() + self._deadline_s
        return True

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Run by ``serve_forever`` on every turn of its loop."""
        self.end_connections(everyone=False)

    def end_connections(self, *, everyone: bool) -> None:
        """Shut down the sockets of connections past their deadline (or all of them);
        their threads then see the end of the stream and finish."""
        now = time.monotonic()
        with self._lock:
            for sock, deadline in self._open.items():
                if everyone or deadline <= now:
                    with contextlib.suppress(OSError):  # the client is gone already
                        sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (or was cut off) is not worth a traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("metrics connection from %s ended: %s", client_address, exc)
        else:
            log.warning("metrics request from %s failed", client_address, exc_info=exc)


def _worker_responses(state: HealthState, registry: CollectorRegistry) -> Respond:
    def respond(path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            return 200, generate_latest(registry), CONTENT_TYPE_LATEST
        if path == "/healthz":
            # While models load the server answers (so /readyz can say why not ready)
            # but /healthz does not: a startup probe waits for the load, however long.
            ok = state.models_loaded and state.live()
            why = f"{state.liveness_problem()}\n" if state.models_loaded else "loading models\n"
            return (200 if ok else 503), (b"ok\n" if ok else why.encode()), _TEXT
        if path == "/readyz":
            reasons = state.not_ready_reasons()
            body = ("ready\n" if not reasons else "; ".join(reasons) + "\n").encode()
            return (503 if reasons else 200), body, _TEXT
        return 404, b"not found\n", _TEXT

    return respond


def reload_response(reload: Callable[[], str | None]) -> Respond:
    """The ``post`` answers of an endpoint whose ``POST /reload`` calls ``reload``, which
    must not block (it asks; the reloader's thread does the work) and may return the
    line to answer with."""

    def respond(path: str) -> tuple[int, bytes, str]:
        if path != RELOAD_PATH:
            return 404, b"not found\n", _TEXT
        said = reload()
        return 202, f"{said or 'reload requested'}\n".encode(), _TEXT

    return respond


def _handler_for(
    respond: Respond, post: Respond | None, timeout_s: float
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = timeout_s  # StreamRequestHandler.setup sets it on the socket

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if post is not None and path == RELOAD_PATH:
                self._answer(405, b"use POST\n", _TEXT, allow="POST")
                return
            self._answer(*respond(path))

        def do_POST(self) -> None:
            if post is None:
                self.send_error(501, f"Unsupported method ({self.command!r})")
                return
            length = self.headers.get("Content-Length", "0")
            wanted = int(length) if length.isdigit() else 0
            if wanted > _MAX_POST_BODY:
                self._answer(413, b"no body is wanted\n", _TEXT)
                return
            self.rfile.read(wanted)  # none is needed; read so the client sees the answer
            self._answer(*post(self.path.split("?", 1)[0]))

        def _answer(self, code: int, body: bytes, ctype: str, allow: str | None = None) -> None:
            self.send_response(code)
            if allow is not None:
                self.send_header("Allow", allow)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would flood the log

    return Handler

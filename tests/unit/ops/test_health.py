"""The health and metrics endpoint: its answers, and connections bounded in number and time.

Real sockets on 127.0.0.1 with a port the kernel picks. Clients here open connections
and send nothing (or a byte now and then), as a port scanner or a stuck proxy would.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from worker.ops.health import (
    CONNECTION_DEADLINE_S,
    CONNECTION_TIMEOUT_S,
    MAX_CONNECTIONS,
    HealthServer,
    HealthState,
    HttpEndpoint,
    reload_response,
)

Serve = Callable[..., HealthServer]


@pytest.fixture
def state() -> HealthState:
    return HealthState(models_loaded=True, joined=True, broker_ok=True)


@pytest.fixture
def serve(state: HealthState) -> Iterator[Serve]:
    """Factory: a started server on a free port; stopped after the test."""
    servers: list[HealthServer] = []

    def start(**limits: Any) -> HealthServer:
        registry = CollectorRegistry()
        Counter("probe_test_total", "a metric to find in /metrics", registry=registry).inc(3)
        server = HealthServer(state, registry, "127.0.0.1", 0, **limits).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def clients() -> Iterator[Callable[[int, int], list[socket.socket]]]:
    """Factory: ``n`` connected client sockets that send nothing; closed after the test."""
    with contextlib.ExitStack() as stack:

        def connect(port: int, n: int) -> list[socket.socket]:
            socks = []
            for _ in range(n):
                s = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
                socks.append(s)
            return socks

        yield connect


def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (end of stream or reset) within ``within`` s."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def new_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t not in before}


# --- what probes and scrapers see ------------------------------------------------------


def test_defaults_are_small_and_bounded() -> None:
    assert 1 <= MAX_CONNECTIONS <= 64
    assert 1 <= CONNECTION_TIMEOUT_S <= 10
    assert CONNECTION_TIMEOUT_S < CONNECTION_DEADLINE_S <= 60


def test_endpoints_answer_as_before(serve: Serve, state: HealthState) -> None:
    server = serve()
    assert get(server.port, "/healthz") == (200, b"ok\n")
    assert get(server.port, "/readyz") == (200, b"ready\n")
    status, body = get(server.port, "/metrics?x=1")
    assert status == 200
    assert b"probe_test_total 3.0" in body
    assert get(server.port, "/nope")[0] == 404
    state.feature_store_ok = False
    assert get(server.port, "/readyz") == (503, b"feature store unreachable\n")
    state.loop_turned_at -= state.liveness_timeout_s + 1
    assert get(server.port, "/healthz") == (503, b"loop stalled\n")


def test_one_held_pipeline_of_two_makes_the_worker_not_ready_naming_it(
    serve: Serve, state: HealthState
) -> None:
    """Readiness means every configured pipeline is served: a held one says so, by
    name, while the worker stays live."""
    server = serve()
    held, other = state.model_for("held"), state.model_for("other")
    held(False, "pipeline held: the model refused a whole batch")
    other(True, None)
    assert get(server.port, "/readyz") == (
        503,
        b"pipeline held: the model refused a whole batch\n",
    )
    assert get(server.port, "/healthz") == (200, b"ok\n")
    held(True, None)
    assert get(server.port, "/readyz") == (200, b"ready\n")


def test_while_models_load_the_probes_answer_not_yet(serve: Serve, state: HealthState) -> None:
    """The server starts before the models load: a startup probe on /healthz waits for
    the load however long it takes, and /readyz already says why it is not ready."""
    state.models_loaded = False
    state.broker_ok = False
    server = serve()
    assert get(server.port, "/healthz") == (503, b"loading models\n")
    status, body = get(server.port, "/readyz")
    assert status == 503 and b"models not loaded" in body and b"no Kafka broker yet" in body


def test_limits_must_be_positive(state: HealthState) -> None:
    with pytest.raises(ValueError, match="positive"):
        HealthServer(state, CollectorRegistry(), "127.0.0.1", 0, max_connections=0)


# --- bounded in number ---------------------------------------------------------------


def test_idle_connections_beyond_the_cap_get_no_thread(
    serve: Serve, clients: Callable[[int, int], list[socket.socket]]
) -> None:
    before = set(threading.enumerate())
    server = serve(max_connections=4, connection_timeout_s=30, connection_deadline_s=60)
    socks = clients(server.port, 40)
    assert wait_until(lambda: server.open_connections == 4)
    # the accept loop's thread and one per admitted connection, not one per client
    time.sleep(0.3)
    assert len(new_threads(before)) <= 4 + 1
    # the 36 beyond the cap are closed at once; the 4 admitted ones are still open
    closed = [s for s in socks if closed_by_server(s, within=0.5)]
    assert len(closed) == 36
    assert server.open_connections == 4


def test_healthz_answers_while_idle_connections_are_open(
    serve: Serve, clients: Callable[[int, int], list[socket.socket]]
) -> None:
    server = serve(max_connections=8, connection_timeout_s=30, connection_deadline_s=60)
    clients(server.port, 7)
    assert wait_until(lambda: server.open_connections == 7)
    for _ in range(5):
        # the previous probe's connection counts until its thread has closed it
        assert wait_until(lambda: server.open_connections == 7)
        assert get(server.port, "/healthz") == (200, b"ok\n")
    assert wait_until(lambda: server.open_connections == 7), "the idle ones stay"


# --- bounded in time -----------------------------------------------------------------


def test_idle_connections_are_closed_after_the_timeout(
    serve: Serve, clients: Callable[[int, int], list[socket.socket]]
) -> None:
    before = set(threading.enumerate())
    server = serve(max_connections=8, connection_timeout_s=0.6, connection_deadline_s=60)
    started = time.monotonic()
    socks = clients(server.port, 6)
    assert wait_until(lambda: server.open_connections == 6)
    assert get(server.port, "/healthz") == (200, b"ok\n")
    assert all(closed_by_server(s, within=5) for s in socks)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 3
    assert wait_until(lambda: server.open_connections == 0)
    # their threads are gone too: only the accept loop's remains
    assert wait_until(lambda: len(new_threads(before)) == 1)


def test_a_full_server_serves_again_once_idle_connections_time_out(
    serve: Serve, clients: Callable[[int, int], list[socket.socket]]
) -> None:
    server = serve(max_connections=2, connection_timeout_s=0.5, connection_deadline_s=60)
    clients(server.port, 2)
    assert wait_until(lambda: server.open_connections == 2)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        get(server.port, "/healthz")
    assert wait_until(lambda: server.open_connections == 0)
    assert get(server.port, "/healthz") == (200, b"ok\n")


def test_a_trickling_client_is_cut_off_at_the_deadline(serve: Serve) -> None:
    """A byte every 0.2 s never trips a 2 s read timeout; the deadline ends it anyway."""
    server = serve(max_connections=4, connection_timeout_s=2.0, connection_deadline_s=2.5)
    request = b"GET /healthz HTTP/1.0\r\nX-Slow: " + b"a" * 200
    started = time.monotonic()
    ended = False
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(0.2)
        for byte in request:
            if ended or time.monotonic() - started > 10:
                break
            try:
                sock.sendall(bytes([byte]))
                ended = sock.recv(1024) == b""
            except TimeoutError:
                continue
            except ConnectionError:
                ended = True
        elapsed = time.monotonic() - started
    assert ended, "the server kept a trickling connection open for 10 s"
    assert 2.4 <= elapsed < 6
    assert wait_until(lambda: server.open_connections == 0)


def test_stop_ends_open_connections(
    serve: Serve, clients: Callable[[int, int], list[socket.socket]]
) -> None:
    before = set(threading.enumerate())
    server = serve(max_connections=8, connection_timeout_s=30, connection_deadline_s=60)
    socks = clients(server.port, 3)
    assert wait_until(lambda: server.open_connections == 3)
    server.stop()
    assert all(closed_by_server(s, within=2) for s in socks)
    assert wait_until(lambda: not new_threads(before))


def test_not_ready_until_a_broker_answers_and_says_why() -> None:
    state = HealthState(models_loaded=True)
    assert "no Kafka broker yet" in state.not_ready_reasons()
    state.broker(False, "Local: All broker connections are down")
    assert "Kafka brokers unreachable: Local: All broker connections are down" in (
        state.not_ready_reasons()
    )
    state.broker(True)
    state.joined = True
    assert state.not_ready_reasons() == []


# --- POST /reload ------------------------------------------------------------------------


def request(
    port: int, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()


def test_post_reload_asks_and_answers_202_at_once(state: HealthState) -> None:
    asked = threading.Event()
    server = HealthServer(state, CollectorRegistry(), "127.0.0.1", 0, reload=asked.set).start()
    try:
        status, body, _ = request(server.port, "POST", "/reload")
        assert (status, body) == (202, b"reload requested\n")
        assert asked.is_set()
        asked.clear()
        assert request(server.port, "POST", "/reload?now=1", b"{}")[0] == 202
        assert asked.is_set()
        assert request(server.port, "POST", "/metrics")[0] == 404
        status, _, headers = request(server.port, "GET", "/reload")
        assert (status, headers.get("Allow")) == (405, "POST")
        assert get(server.port, "/healthz") == (200, b"ok\n")  # GET as before
        status, _, _ = request(server.port, "POST", "/reload", b"x" * (64 * 1024 + 1))
        assert status == 413
    finally:
        server.stop()


def test_without_the_reload_endpoint_post_is_refused_as_before(serve: Serve) -> None:
    server = serve()
    assert request(server.port, "POST", "/reload")[0] == 501
    assert request(server.port, "PUT", "/reload")[0] == 501
    assert get(server.port, "/reload")[0] == 404


def test_the_reload_answer_may_say_what_was_asked(state: HealthState) -> None:
    endpoint = HttpEndpoint(
        lambda path: (404, b"", "text/plain"),
        "127.0.0.1",
        0,
        post=reload_response(lambda: "reload requested of 3 worker processes"),
    ).start()
    try:
        status, body, _ = request(endpoint.port, "POST", "/reload")
        assert (status, body) == (202, b"reload requested of 3 worker processes\n")
    finally:
        endpoint.stop()

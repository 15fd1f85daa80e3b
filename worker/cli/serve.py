"""``streamfer run``: one worker, or a supervisor of ``--processes N``, until a signal."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from worker.cli.signals import install_reload_signal, install_signal_handlers
from worker.core import __version__
from worker.errors import (
    CallStalled,
    ConfigError,
    MemberFenced,
    ProducerUnusable,
    StreamferError,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from worker.config import WorkerConfig
    from worker.ops import HealthState, Recoveries

__all__ = ["cmd_run"]

log = logging.getLogger("streamfer")


def cmd_run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from worker.compose import build_worker
    from worker.config import load_config
    from worker.ops import (
        PROCESSES_ENV,
        HealthState,
        Recoveries,
        follow_supervisor,
        parse_processes,
        settle_heap,
        setup_logging,
        supervised_index,
    )

    given = args.processes is not None
    try:
        processes = parse_processes(args.processes if given else os.environ.get(PROCESSES_ENV, "1"))
    except ConfigError as exc:
        where = "--processes" if given else f"{PROCESSES_ENV} (the default of --processes)"
        print(f"streamfer: {where}: {exc}", file=sys.stderr)
        return 2
    index = supervised_index(os.environ)
    if index is not None and not follow_supervisor(os.environ):
        print("streamfer: the supervisor that started this worker is gone", file=sys.stderr)
        return 1
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"streamfer: {exc}", file=sys.stderr)
        return 2
    if processes > 1 and index is None:
        return _run_supervisor(args, config, processes)
    reload_requests = threading.Event()
    install_reload_signal(reload_requests.set)
    setup_logging(
        config.log_format, getattr(logging, config.log_level.upper()), process_index=index
    )
    # Probes answer from the start: /readyz says why not ready while models load and
    # until a broker answers.
    registry = CollectorRegistry()
    recoveries = Recoveries(os.environ, registry)
    health = HealthState(liveness_timeout_s=config.liveness_timeout_s)
    if config.metrics.port is not None:
        _serve_probes(config, health, registry, reload_requests)

    def stopping() -> bool:
        return health.stopping

    try:
        worker = build_worker(config, registry, health, reload_requests)
    except CallStalled as exc:
        _recover("cannot start", exc, recoveries, stopping)
    except StreamferError as exc:
        log.error("cannot start: %s", exc)
        return 2 if isinstance(exc, ConfigError) else 1
    install_signal_handlers(worker.stop, repeat_exits=index is None)
    log.info(
        "streamfer %s: group %s, pipelines %s",
        __version__,
        config.kafka.group_id,
        [p.name for p in config.pipelines],
    )
    settle_heap()
    try:
        worker.run(burst_idle_s=args.burst_idle_s)
    except CallStalled as exc:
        _recover("worker stopped", exc, recoveries, stopping)
    except ProducerUnusable as exc:
        recoveries.restart("producer_unusable", f"worker stopped: {exc}", stopping)
        return _stopped(exc, stopping)
    except MemberFenced as exc:
        recoveries.restart("member_fenced", f"worker stopped: {exc}", stopping)
        return _stopped(exc, stopping)
    except StreamferError as exc:
        log.error("worker stopped: %s", exc)
        return 1
    log.info("stopped cleanly")
    return 0


def _serve_probes(
    config: WorkerConfig,
    health: HealthState,
    registry: CollectorRegistry,
    reload_requests: threading.Event,
) -> None:
    """``/metrics``, ``/healthz``, ``/readyz`` (and ``POST /reload`` where the config
    allows it) on ``config.metrics``' port, from before the models load."""
    from worker.ops import HealthServer

    assert config.metrics.port is not None
    reload = reload_requests.set if config.metrics.reload_endpoint else None
    server = HealthServer(
        health, registry, config.metrics.host, config.metrics.port, reload=reload
    ).start()
    log.info(
        "metrics, /healthz and /readyz%s on http://%s:%d",
        " (and POST /reload)" if reload is not None else "",
        config.metrics.host,
        server.port,
    )


def _stopped(exc: StreamferError, stopping: Callable[[], bool]) -> int:
    """The exit code of a worker whose client a recovery could not replace: 0 when a
    signal asked it to stop (it did; the next owner starts from the committed offsets),
    else 1."""
    if stopping():
        log.warning("stopped as asked: %s", exc)
        return 0
    log.error("worker stopped: %s", exc)
    return 1


def _recover(
    what: str,
    exc: CallStalled,
    recoveries: Recoveries,
    stopping: Callable[[], bool],
    exit_now: Callable[[int], object] = os._exit,
) -> NoReturn:
    """A Kafka client is stuck inside a call: start the worker again in place
    (``worker.ops.recovery``), or end the process at once, without the interpreter's
    clean exit, which would wait on the stuck call for good. A worker a signal asked to
    stop exits 0: it stopped as asked, and nothing is lost, because the stuck transaction
    never commits and the next owner starts from the committed offsets. One whose new
    image cannot start exits 1."""
    recoveries.restart("call_stalled", f"{what}: {exc}", stopping)
    if stopping():
        log.warning(
            "stopped as asked, leaving the Kafka clients unclosed (%s: %s); the open "
            "transaction never commits, the next owner starts from the committed offsets",
            what,
            exc,
        )
        code = 0
    else:
        log.error("%s: %s; exiting without closing the Kafka clients", what, exc)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    exit_now(code)
    raise AssertionError("unreachable: os._exit returned")


def _run_supervisor(args: argparse.Namespace, config: WorkerConfig, processes: int) -> int:
    """``run --processes N``: N workers of the group under one supervisor, whose merged
    /metrics, /healthz and /readyz take the configured address."""
    from prometheus_client import CollectorRegistry

    from worker.ops import (
        HttpEndpoint,
        MergedEndpoints,
        Supervisor,
        plan_for,
        reload_response,
        setup_logging,
    )

    setup_logging(config.log_format, getattr(logging, config.log_level.upper()))
    registry = CollectorRegistry()
    plan = plan_for(
        config, args.config, processes, burst_idle_s=args.burst_idle_s, environ=os.environ
    )
    supervisor = Supervisor(plan, registry)
    install_signal_handlers(supervisor.signalled, repeat_exits=False)
    install_reload_signal(supervisor.request_reload)
    merged: MergedEndpoints | None = None
    server: HttpEndpoint | None = None
    if config.metrics.port is not None:
        merged = MergedEndpoints(
            supervisor.children,
            registry,
            stopping=lambda: supervisor.stopping,
            threads=min(64, 2 * processes),
        )
        post = (
            reload_response(supervisor.request_reload) if config.metrics.reload_endpoint else None
        )
        try:
            server = HttpEndpoint(
                merged.respond, config.metrics.host, config.metrics.port, post=post
            )
        except OSError as exc:
            where = f"{config.metrics.host}:{config.metrics.port}"
            log.error("cannot serve metrics on %s (metrics.host, metrics.port): %s", where, exc)
            return 1
        server.start()
        log.info(
            "supervisor: metrics, /healthz and /readyz of %d processes on http://%s:%d",
            processes,
            config.metrics.host,
            server.port,
        )
    log.info(
        "streamfer %s: supervising %d worker processes of group %s",
        __version__,
        processes,
        config.kafka.group_id,
    )
    try:
        return supervisor.run()
    finally:
        if server is not None:
            server.stop()
        if merged is not None:
            merged.close()

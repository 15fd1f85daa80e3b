"""Several worker processes of one group on one host: ``streamfer run --processes N``.

One Python process spends microseconds of GIL time per record, so one worker tops out at
a few tens of thousands of records per second however fast its model runs. The
supervisor starts N ordinary workers (``python -m worker run`` with the same config) as
children, each a member of the consumer group in its own right, and keeps them running.
A child that crashes is started again after a backoff (1 s doubling to 30 s, back to 1 s
once a child has run 60 s); a child that exits 2 (a bad config, a model that does not
fit) would fail again, so the supervisor stops the others and exits 2. SIGTERM or SIGINT
is forwarded once, as SIGTERM, to every child, which drains and commits; a second signal
SIGKILLs them. SIGHUP (and ``POST /reload`` on the supervisor's endpoint) is forwarded,
as SIGHUP, to every running child: each looks for a new model version
(``worker.models.reloader``). Children start with SIGHUP blocked, until their handler is in
place, so an early one is held rather than fatal; a child started later loads the newest
version anyway. Children run in process groups of their own (a terminal's Ctrl-C reaches
the supervisor only) and ask the kernel for a SIGTERM when the supervisor dies
(``follow_supervisor``, PR_SET_PDEATHSIG), so none outlives it, even a SIGKILLed one.

A child learns its index from ``STREAMFER_PROCESS_INDEX``, serves its probes on a port of
its own on 127.0.0.1 (``STREAMFER_METRICS__HOST`` / ``__PORT``) and, with static
membership, joins as ``<group_instance_id>-<index>``: two members with one instance id
fence each other. ``worker.ops.metrics_merge`` serves the children's endpoints as one.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from worker.config import WorkerConfig
from worker.core import Clock, monotonic_clock
from worker.errors import ConfigError

__all__ = [
    "MAX_PROCESSES",
    "PROCESSES_ENV",
    "PROCESS_INDEX_ENV",
    "SUPERVISOR_PID_ENV",
    "ChildState",
    "ChildStatus",
    "RestartPolicy",
    "Supervisor",
    "SupervisorPlan",
    "cgroup_cpu_limit",
    "child_environment",
    "follow_supervisor",
    "parse_processes",
    "plan_for",
    "supervised_index",
    "usable_cores",
]

log = logging.getLogger(__name__)

PROCESSES_ENV = "STREAMFER_PROCESSES"
"""The default of ``--processes``, for containers."""
PROCESS_INDEX_ENV = "STREAMFER_PROCESS_INDEX"
"""Set in each child: its index, 0 … N-1 (in its log lines and its ``process`` label)."""
SUPERVISOR_PID_ENV = "STREAMFER_SUPERVISOR_PID"
"""Set in each child: the supervisor it must not outlive."""
MAX_PROCESSES = 256
STOP_MARGIN_S = 15.0
"""Beyond ``shutdown_timeout_s`` (the drain) a stopping child may spend this long flushing
its producer, committing and leaving the group before it is SIGKILLed."""
_TICK_S = 0.1
_PR_SET_PDEATHSIG = 1


def parse_processes(text: str, *, cores: Callable[[], int] | None = None) -> int:
    """``--processes``: a whole number from 1 to ``MAX_PROCESSES``, or ``auto`` (the usable
    cores). Raises ``ConfigError`` saying what is allowed."""
    value = text.strip().lower()
    if value == "auto":
        return (cores or usable_cores)()
    if value.isdigit() and 1 <= int(value) <= MAX_PROCESSES:
        return int(value)
    raise ConfigError(
        f"must be a whole number from 1 to {MAX_PROCESSES} or 'auto' (the usable cores), "
        f"not {text!r}"
    )


def usable_cores(
    *,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> int:
    """The CPUs this process may run on, capped by a cgroup v2 CPU quota; at least 1.

    A container limited to 1.5 CPUs on a 64-core node gets 2, not 64."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = cgroup_cpu_limit(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)
    return max(1, min(cores or 1, limit or MAX_PROCESSES))


def cgroup_cpu_limit(*, cgroup_root: Path, proc_cgroup: Path) -> int | None:
    """ceil(quota / period) of the tightest ``cpu.max`` from this process's cgroup (v2) up
    to the root, or None when no quota is set (or there is no cgroup v2 to read)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None  # cgroup v1 only
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    limits = []
    for depth in range(len(parts), -1, -1):
        try:
            fields = (cgroup_root.joinpath(*parts[:depth]) / "cpu.max").read_text().split()
        except OSError:
            continue
        if len(fields) == 2 and fields[0] != "max":
            with contextlib.suppress(ValueError):
                quota, period = int(fields[0]), int(fields[1])
                if quota > 0 and period > 0:
                    limits.append(math.ceil(quota / period))
    return min(limits) if limits else None


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How long a crashed child waits before its next start."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    healthy_after_s: float = 60.0
    """A child that ran this long before it stopped starts the backoff afresh."""

    def after_exit(self, quick_failures: int, ran_s: float) -> tuple[float, int]:
        """The wait before the next start of a child that ran ``ran_s`` after
        ``quick_failures`` exits in a row that came sooner than ``healthy_after_s``; and the
        count of those to remember for its next exit."""
        if ran_s >= self.healthy_after_s:
            quick_failures = 0
        delay = min(self.max_delay_s, self.first_delay_s * 2.0 ** min(quick_failures, 32))
        return delay, quick_failures + 1


@dataclass(frozen=True)
class SupervisorPlan:
    """What to run: ``processes`` copies of ``command``, each in ``child_environment``."""

    processes: int
    command: tuple[str, ...]
    environ: Mapping[str, str]
    child_metrics: bool
    """Whether each child serves probes (on a free port on 127.0.0.1)."""
    group_instance_id: str | None
    stop_timeout_s: float
    """How long a stop waits for the children before it SIGKILLs them."""
    burst: bool
    """Children exit 0 when idle: they are done, and so is the supervisor once all are."""
    restart: RestartPolicy = RestartPolicy()


def plan_for(
    config: WorkerConfig,
    config_path: Path,
    processes: int,
    *,
    burst_idle_s: float | None,
    environ: Mapping[str, str],
) -> SupervisorPlan:
    """The plan for ``streamfer run --config PATH --processes N [--burst-idle-s S]``: each
    child runs the same command without ``--processes``."""
    command = [sys.executable, "-m", "worker", "run", "--config", str(config_path)]
    if burst_idle_s is not None:
        command += ["--burst-idle-s", repr(burst_idle_s)]
    return SupervisorPlan(
        processes=processes,
        command=tuple(command),
        environ=dict(environ),
        child_metrics=config.metrics.port is not None,
        group_instance_id=config.kafka.group_instance_id,
        stop_timeout_s=config.shutdown_timeout_s + STOP_MARGIN_S,
        burst=burst_idle_s is not None,
    )


def child_environment(
    plan: SupervisorPlan, index: int, port: int | None, supervisor_pid: int
) -> dict[str, str]:
    """The supervisor's environment, told which child this is, where its probes go and
    which static member it is; never told to supervise again."""
    env = {k: v for k, v in plan.environ.items() if k != PROCESSES_ENV}
    env[PROCESS_INDEX_ENV] = str(index)
    env[SUPERVISOR_PID_ENV] = str(supervisor_pid)
    if port is not None:
        env["STREAMFER_METRICS__HOST"] = "127.0.0.1"
        env["STREAMFER_METRICS__PORT"] = str(port)
    if plan.group_instance_id is not None:
        env["STREAMFER_KAFKA__GROUP_INSTANCE_ID"] = f"{plan.group_instance_id}-{index}"
    return env


def follow_supervisor(environ: Mapping[str, str]) -> bool:
    """In a child: have the kernel send SIGTERM (a drain) when the supervisor dies.

    Returns False when the supervisor is gone already (the child should exit); True when
    it is there, or when this child has no supervisor. Linux only (PR_SET_PDEATHSIG);
    elsewhere a child outlives a supervisor killed with SIGKILL."""
    pid = environ.get(SUPERVISOR_PID_ENV)
    if not pid:
        return True
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG): %s", os.strerror(ctypes.get_errno()))
    # Asked after prctl, so a supervisor that died just before it is still seen.
    return os.getppid() == int(pid)


ChildState = Literal["running", "restarting", "done", "stopped"]


@dataclass(frozen=True, slots=True)
class ChildStatus:
    """One child as the merged endpoints see it."""

    index: int
    state: ChildState
    port: int | None
    """Where it serves its probes while running."""
    exit_code: int | None
    """How it last exited (negative: killed by that signal)."""
    restarts: int

    def exit_text(self) -> str:
        code = self.exit_code
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"exit code {code}: {signal.Signals(-code).name}"
        return f"exit code {code}"


@dataclass
class _Child:
    index: int
    process: subprocess.Popen[bytes] | None = None
    port: int | None = None
    started_at: float = 0.0
    exit_code: int | None = None
    restart_at: float | None = None
    quick_failures: int = 0
    restarts: int = 0
    done: bool = False

    def running(self) -> bool:
        return self.process is not None


class Supervisor:
    """Runs a ``SupervisorPlan`` on the calling (main) thread until it ends: see the
    module docstring for the policy. ``signalled`` is the signal handlers' whole work;
    ``children`` may be called from any thread."""

    def __init__(
        self,
        plan: SupervisorPlan,
        registry: CollectorRegistry | None = None,
        *,
        tick_s: float = _TICK_S,
        clock: Clock = monotonic_clock,
    ) -> None:
        if plan.processes < 1:
            raise ValueError("a supervisor needs at least one process")
        self._plan = plan
        self._tick_s = tick_s
        self._clock = clock
        self._lock = threading.Lock()
        self._children = [_Child(i) for i in range(plan.processes)]
        self._signals = 0
        self._reload = threading.Event()
        self._stop_deadline: float | None = None
        self._draining: list[_Child] = []
        """The children running when the stop began: the exit code says how they ended."""
        self._killed = False
        self._fatal = False
        r = registry if registry is not None else CollectorRegistry()
        Gauge(
            "streamfer_supervisor_processes",
            "Worker processes this supervisor keeps running",
            registry=r,
        ).set(plan.processes)
        restarts = Counter(
            "streamfer_supervisor_restarts",
            "Times a worker process exited and was to be started again",
            ["process"],
            registry=r,
        )
        self._restarts = [restarts.labels(str(i)) for i in range(plan.processes)]

    def signalled(self) -> None:
        """A SIGTERM or SIGINT came: the first drains every child, the next kills them."""
        self._signals += 1

    def request_reload(self) -> str:
        """SIGHUP or ``POST /reload``: every running child is sent SIGHUP (from the
        supervising thread); only sets a flag here."""
        self._reload.set()
        return f"reload requested of {self._plan.processes} worker processes"

    @property
    def stopping(self) -> bool:
        return self._stop_deadline is not None

    def children(self) -> list[ChildStatus]:
        with self._lock:
            return [self._status(c) for c in self._children]

    def run(self) -> int:
        """Start the children and supervise them. Returns the exit code: 0 when every child
        drained cleanly (or, in burst mode, finished), 2 when one refused its config, 1
        otherwise. No child is left running when it returns."""
        try:
            for child in self._children:
                self._start(child)
            return self._supervise()
        finally:
            self._kill_running()

    def _supervise(self) -> int:
        while True:
            if self._signals and not self.stopping:
                log.info("signal: draining %d worker processes", self._plan.processes)
                self._begin_stop()
            if self._signals > 1 and not self._killed:
                log.warning("second signal: killing the worker processes")
                self._kill_running()
            if self._reload.is_set():
                self._reload.clear()
                self._forward_reload()
            for child in self._children:
                code = child.process.poll() if child.process is not None else None
                if code is not None:
                    self._exited(child, code)
            now = self._clock()
            if self._stop_deadline is not None:
                if not any(c.running() for c in self._children):
                    return self._stop_code()
                if now >= self._stop_deadline:
                    log.error(
                        "worker processes still running %.0fs after the stop: killing them",
                        self._plan.stop_timeout_s,
                    )
                    self._kill_running()
                    return 2 if self._fatal else 1
            elif self._plan.burst and all(c.done for c in self._children):
                log.info("every worker process finished")
                return 0
            else:
                for child in self._children:
                    if child.restart_at is not None and now >= child.restart_at:
                        self._start(child)
            time.sleep(self._tick_s)

    def _stop_code(self) -> int:
        if self._fatal:
            return 2
        return 0 if all(c.exit_code == 0 for c in self._draining) else 1

    def _start(self, child: _Child) -> None:
        port = _free_port() if self._plan.child_metrics else None
        env = child_environment(self._plan, child.index, port, os.getpid())
        with self._lock:
            child.restart_at = None
            child.port = port
            child.started_at = self._clock()
            # SIGHUP blocked in the child until its handler is there (worker.cli)
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
            try:
                # Its own process group: a terminal's Ctrl-C reaches the supervisor alone,
                # which forwards it once (a second one would make the child exit at once).
                child.process = subprocess.Popen(
                    self._plan.command, env=env, stdin=subprocess.DEVNULL, process_group=0
                )
            except OSError as exc:
                log.error("process %d: cannot start: %s", child.index, exc)
                child.restart_at = self._clock() + self._plan.restart.max_delay_s
                return
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        log.info("process %d started: pid %d", child.index, child.process.pid)

    def _forward_reload(self) -> None:
        if self.stopping:
            return
        sent = 0
        for child in self._children:
            if child.process is not None and child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.process.pid, signal.SIGHUP)
                    sent += 1
        log.info("reload: SIGHUP sent to %d worker processes", sent)

    def _exited(self, child: _Child, code: int) -> None:
        """Record how a child ended and decide what follows: nothing while stopping, a stop
        of all after exit 2, done (burst mode, exit 0), or a start after the backoff."""
        ran_s = self._clock() - child.started_at
        pid = child.process.pid if child.process is not None else -1
        fatal = code == 2 and not self.stopping
        restart = not self.stopping and not fatal and not (code == 0 and self._plan.burst)
        delay = 0.0
        if restart:
            delay, child.quick_failures = self._plan.restart.after_exit(child.quick_failures, ran_s)
        with self._lock:  # one step, so that /readyz never sees it half done
            child.process = None
            child.port = None
            child.exit_code = code
            child.done = code == 0 and self._plan.burst and not self.stopping
            if restart:
                child.restart_at = self._clock() + delay
                child.restarts += 1
        how = self._status(child).exit_text()
        if restart:
            self._restarts[child.index].inc()
            log.warning(
                "process %d (pid %d) exited after %.1fs (%s): restarting it in %.1fs",
                child.index,
                pid,
                ran_s,
                how,
                delay,
            )
        elif fatal:
            log.error(
                "process %d (pid %d) refused its configuration (exit code 2): not restarting "
                "it; stopping the others",
                child.index,
                pid,
            )
            self._fatal = True
            self._begin_stop()
        elif child.done:
            log.info("process %d (pid %d) finished", child.index, pid)
        else:
            log.info("process %d (pid %d) stopped: %s", child.index, pid, how)

    def _begin_stop(self) -> None:
        self._stop_deadline = self._clock() + self._plan.stop_timeout_s
        self._draining = [c for c in self._children if c.running()]
        for child in self._children:
            child.restart_at = None
            if child.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.process.pid, signal.SIGTERM)

    def _kill_running(self) -> None:
        """SIGKILL every child still running and reap it."""
        self._killed = True
        if self._stop_deadline is None:  # an exception ends the supervisor: no restarts
            self._stop_deadline = self._clock()
        for child in self._children:
            process = child.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)
            if process is not None and process.returncode is not None:
                self._exited(child, process.returncode)

    def _status(self, child: _Child) -> ChildStatus:
        state: ChildState
        if child.process is not None:
            state = "running"
        elif child.done:
            state = "done"
        elif child.restart_at is not None:
            state = "restarting"
        else:
            state = "stopped"
        return ChildStatus(child.index, state, child.port, child.exit_code, child.restarts)


def _free_port() -> int:
    """A port nothing listens on now. A child that loses it to another program before it
    binds fails to start and is started again, on another port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def supervised_index(environ: Mapping[str, str]) -> int | None:
    """This process's index when a supervisor started it, else None."""
    text = environ.get(PROCESS_INDEX_ENV, "")
    return int(text) if text.isdigit() else None

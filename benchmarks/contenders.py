"""Starting and stopping the contender processes: streamfer, naive, faust, passthrough.

Each contender runs as its own process(es), started from the repository root with its
output in a log file, and stopped by PID (SIGTERM, then SIGKILL). ``launch`` builds the
command line (or, for streamfer, the worker config via ``streamfer_dev.harness``) from a
``Job``: where Kafka and Redis are, which topics and group, which model and fields.
Every contender announces its assignment with a log line containing ``owning N
partitions``; ``Launched.wait_ready`` waits until together they own every partition.
``streamfer_2p`` is one ``streamfer run --processes 2``: a supervisor whose two workers
log to its file, each line naming its process index; its CPU time and memory are its
workers' too (``Launched.pids`` includes the processes' descendants).
``streamfer_cache`` is one worker with the output cache on (in process only, its
default ``max_entries``). ``streamfer_share`` and ``streamfer_share_2w`` are one and two
workers in a share group (KIP-932, ``[kafka] share_group``), which all serve a partition
together, where ``streamfer_2w`` on one partition leaves a worker idle.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from streamfer_dev.harness import WorkerProcess, worker_config_toml
from worker.errors import StackError

__all__ = ["KAFKA_CONTENDERS", "Job", "Launched", "Layout", "launch"]

ROOT = Path(__file__).resolve().parent.parent

Layout = Literal["hash", "packed"]

KAFKA_CONTENDERS = (
    "streamfer",
    "streamfer_baseline",
    "streamfer_2w",
    "streamfer_2p",
    "streamfer_cache",
    "streamfer_triton",
    "streamfer_triton_1",
    "streamfer_share",
    "streamfer_share_2w",
    "naive",
    "batch_loop",
    "faust",
    "passthrough",
    "relay",
    "streamfer_latency",
)

_OWNING = re.compile(r"owning (\d+) partitions")
_OWNING_BY_INDEX = re.compile(r"\[\d+ process (\d+)\] .*owning (\d+) partitions")


@dataclass(frozen=True)
class Job:
    """Everything a contender needs to know to serve one run."""

    bootstrap: str
    redis_url: str
    request_topic: str
    result_topic: str
    dead_letter_topic: str
    group: str
    model_path: Path
    model_name: str
    fields: list[str]
    workdir: Path
    max_batch_size: int = 256
    max_wait_ms: float = 20.0
    layout: Layout = "hash"
    """How features are stored: ``hash`` (HMGET per entity) or ``packed`` (float32 blob)."""
    batch_mode: str = "fixed"
    """streamfer's ``batch.mode``: ``fixed`` or ``adaptive``."""
    max_in_flight: int | None = None
    """streamfer's ``max_in_flight_batches``; None keeps the worker's default."""
    source_headers: bool = True
    """streamfer's ``source_headers``: off, results carry no provenance headers, like the
    other contenders' results."""
    consumer_options: dict[str, str] = field(default_factory=dict)
    """librdkafka settings for streamfer's consumer (``--consumer-option``)."""
    baseline_root: Path | None = None
    """An earlier commit's source tree (``--baseline-ref``) that ``streamfer_baseline``
    runs, with the same config file as ``streamfer``."""
    triton_url: str | None = None
    """The Triton server ``streamfer_triton``'s worker calls (serving the same model file
    as ``model_name``)."""


@dataclass
class Launched:
    """The processes of one contender and their logs."""

    name: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    members_per_log: int = 1
    """Group members logging to each file: a supervisor's workers share its log."""

    def pids(self) -> list[int]:
        """The processes and their descendants (a supervisor's workers)."""
        return [pid for p in self.processes for pid in _with_descendants(p.pid)]

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.processes)

    def log_tail(self, lines: int = 20) -> str:
        tails = []
        for path in self.logs:
            text = path.read_text(errors="replace") if path.exists() else ""
            tails.append(f"--- {path.name} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails)

    def wait_ready(self, partitions: int, timeout: float) -> None:
        """Until each process owns partitions and their latest counts add up to all."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            owned = []
            for proc, path in zip(self.processes, self.logs, strict=True):
                if proc.poll() is not None:
                    raise StackError(f"{self.name} exited early:\n{self.log_tail()}")
                owned += _owned(path.read_text(errors="replace"), self.members_per_log)
            each = all(owned) or len(owned) > partitions
            if each and sum(owned) >= partitions:
                return
            time.sleep(0.1)
        raise StackError(f"{self.name} did not own {partitions} partitions in {timeout:.0f}s")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM all, wait, then SIGKILL any left; by PID only."""
        for proc in self.processes:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.processes:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def launch(name: str, job: Job) -> Launched:
    """Start the named contender on ``job``."""
    if name == "streamfer_latency":
        return _streamfer(name, replace(job, batch_mode="adaptive"), 1)
    if name in ("streamfer", "streamfer_2w"):
        return _streamfer(name, job, 2 if name == "streamfer_2w" else 1)
    if name == "streamfer_2p":
        return _streamfer(name, job, 1, processes=2)
    if name == "streamfer_cache":
        return _streamfer(name, job, 1, cache=True)
    if name in ("streamfer_triton", "streamfer_triton_1"):
        # streamfer_triton_1: the same worker sending a batch's calls one at a time
        return _streamfer(name, job, 1, calls_in_flight=1 if name.endswith("_1") else None)
    if name in ("streamfer_share", "streamfer_share_2w"):
        return _streamfer(name, job, 2 if name.endswith("_2w") else 1, share_group=True)
    if name == "streamfer_baseline":
        return _baseline(job)
    if name in ("naive", "batch_loop"):
        argv = [
            "-m",
            f"benchmarks.{name}",
            *("--bootstrap", job.bootstrap, "--redis-url", job.redis_url),
            *("--model", str(job.model_path), "--model-name", job.model_name),
            *("--fields", ",".join(job.fields), "--layout", job.layout),
            *("--request-topic", job.request_topic, "--result-topic", job.result_topic),
            *("--group", job.group),
        ]
        if name == "batch_loop":
            argv += ["--batch", str(job.max_batch_size)]
        return _spawn(name, job, [argv], {})
    if name == "passthrough":
        argv = [
            "-m",
            "benchmarks.passthrough",
            *("--bootstrap", job.bootstrap, "--group", job.group),
            *("--request-topic", job.request_topic, "--result-topic", job.result_topic),
            *("--batch", str(job.max_batch_size)),
        ]
        return _spawn(name, job, [argv], {})
    if name == "relay":
        argv = [
            "-m",
            "benchmarks.relay",
            *("--bootstrap", job.bootstrap, "--group", job.group),
            *("--request-topic", job.request_topic, "--result-topic", job.result_topic),
        ]
        return _spawn(name, job, [argv], {})
    if name == "faust":
        datadir = job.workdir / f"faust-{job.group}"
        env = {
            "BENCH_BOOTSTRAP": job.bootstrap,
            "BENCH_REDIS_URL": job.redis_url,
            "BENCH_MODEL": str(job.model_path),
            "BENCH_MODEL_NAME": job.model_name,
            "BENCH_FIELDS": ",".join(job.fields),
            "BENCH_LAYOUT": job.layout,
            "BENCH_REQUEST_TOPIC": job.request_topic,
            "BENCH_RESULT_TOPIC": job.result_topic,
            "BENCH_GROUP": job.group,
            "BENCH_MAX_BATCH": str(job.max_batch_size),
            "BENCH_WITHIN_MS": str(job.max_wait_ms),
        }
        argv = ["-m", "benchmarks.faust_agent", "--datadir", str(datadir)]
        return _spawn(name, job, [[*argv, "worker", "-l", "warn"]], env)
    raise ValueError(f"unknown contender {name!r}")


def _spawn(
    name: str, job: Job, argvs: list[list[str]], env: dict[str, str], cwd: Path = ROOT
) -> Launched:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = _pythonpath()
    full_env.update(env)
    launched = Launched(name)
    for i, argv in enumerate(argvs):
        log_path = job.workdir / f"{name}-{job.group}-{i}.log"
        with log_path.open("ab") as log_file:
            launched.processes.append(
                subprocess.Popen(
                    [sys.executable, *argv],
                    cwd=cwd,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=full_env,
                )
            )
        launched.logs.append(log_path)
    return launched


def _owned(log: str, members: int) -> list[int]:
    """Each member's latest ``owning N partitions`` in one log (0 until it has one)."""
    if members == 1:
        found = _OWNING.findall(log)
        return [int(found[-1]) if found else 0]
    latest = {int(index): int(n) for index, n in _OWNING_BY_INDEX.findall(log)}
    return [latest.get(i, 0) for i in range(members)]


def _with_descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def _baseline(job: Job) -> Launched:
    """The earlier commit in ``job.baseline_root`` as one worker, on ``streamfer``'s config
    file and that commit's defaults: it runs from its own tree (the current directory
    and PYTHONPATH), so its ``worker`` package is imported, not this checkout's."""
    if job.baseline_root is None:
        raise ValueError("streamfer_baseline needs --baseline-ref")
    config = _config_file("streamfer_baseline", job, share_group=False)
    argv = ["-m", "worker", "run", "--config", str(config)]
    env = {"PYTHONPATH": str(job.baseline_root)}
    return _spawn("streamfer_baseline", job, [argv], env, cwd=job.baseline_root)


def _config_file(name: str, job: Job, *, share_group: bool) -> Path:
    """``job``'s worker config, as a user would write it, in the run's folder."""
    config = job.workdir / f"{name}-{job.group}.toml"
    config.write_text(
        worker_config_toml(
            bootstrap=job.bootstrap,
            redis_url=job.redis_url,
            group=job.group,
            request_topic=job.request_topic,
            result_topic=job.result_topic,
            dead_letter_topic=job.dead_letter_topic,
            model_path=job.model_path,
            fields=job.fields,
            max_batch_size=job.max_batch_size,
            max_wait_ms=job.max_wait_ms,
            consumer_options=_typed(job.consumer_options),
            model_name=job.model_name,
            layout=job.layout,
            top=f"max_in_flight_batches = {job.max_in_flight}" if job.max_in_flight else "",
            share_group=share_group,
            triton_url=job.triton_url,
        )
    )
    return config


def _streamfer(
    name: str,
    job: Job,
    workers: int,
    processes: int = 1,
    cache: bool = False,
    share_group: bool = False,
    calls_in_flight: int | None = None,
) -> Launched:
    config = _config_file(name, job, share_group=share_group)
    env = {
        "PYTHONPATH": _pythonpath(),
        "STREAMFER_PIPELINES__0__BATCH__MODE": job.batch_mode,
        "STREAMFER_PIPELINES__0__SOURCE_HEADERS": "true" if job.source_headers else "false",
        "STREAMFER_PIPELINES__0__CACHE__ENABLED": "true" if cache else "false",
    }
    if calls_in_flight is not None:
        env["STREAMFER_PIPELINES__0__MODEL__TRITON__MAX_CALLS_IN_FLIGHT"] = str(calls_in_flight)
    launched = Launched(name, members_per_log=processes)
    args = ("--processes", str(processes)) if processes > 1 else ()
    for i in range(workers):
        log_path = job.workdir / f"{name}-{job.group}-{i}.log"
        worker = WorkerProcess(config, log_path, env, args=args).start()
        assert worker.process is not None
        launched.processes.append(worker.process)
        launched.logs.append(log_path)
    return launched


def _typed(options: dict[str, str]) -> dict[str, Any]:
    """Numbers and booleans as TOML values, the rest as strings."""
    out: dict[str, Any] = {}
    for key, text in options.items():
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            with contextlib.suppress(ValueError):
                value = float(text) if "." in text else int(text)
        out[key] = value
    return out


def _pythonpath() -> str:
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

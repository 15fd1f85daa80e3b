"""The supervisor of ``streamfer run --processes N``: the process count (``auto`` and cgroup
quotas), the restart backoff, each child's environment, and the restart and stop policy,
with small Python scripts as the children (the real worker is in
tests/integration/test_processes.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from worker.config import parse_config
from worker.errors import ConfigError
from worker.ops.supervisor import (
    PROCESS_INDEX_ENV,
    PROCESSES_ENV,
    SUPERVISOR_PID_ENV,
    RestartPolicy,
    Supervisor,
    SupervisorPlan,
    cgroup_cpu_limit,
    child_environment,
    follow_supervisor,
    parse_processes,
    plan_for,
    usable_cores,
)

# -- how many processes --------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("1", 1), ("2", 2), (" 3 ", 3), ("256", 256)])
def test_a_number_of_processes_is_taken_as_given(text: str, expected: int) -> None:
    assert parse_processes(text) == expected


@pytest.mark.parametrize("text", ["auto", "AUTO", " Auto "])
def test_auto_is_the_usable_cores(text: str) -> None:
    assert parse_processes(text, cores=lambda: 7) == 7


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", "", "257", "2 3", "+2", "0x2"])
def test_anything_else_is_refused_saying_what_is_allowed(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_processes(text)
    assert "'auto'" in str(exc.value)
    assert repr(text) in str(exc.value)


def _cgroups(tmp_path: Path, membership: str, quotas: dict[str, str]) -> dict[str, Path]:
    """A /proc/self/cgroup file and a cgroup v2 tree with ``cpu.max`` files at the paths
    given (relative to the root; "" is the root)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for where, text in quotas.items():
        folder = root / where
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(membership)
    return {"cgroup_root": root, "proc_cgroup": proc}


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        ({"kubepods/pod/ctr": "150000 100000"}, 2),  # 1.5 CPUs: 2 processes
        ({"kubepods/pod/ctr": "100000 100000"}, 1),
        ({"kubepods/pod/ctr": "50000 100000"}, 1),  # half a CPU still runs one
        ({"kubepods/pod/ctr": "400000 100000", "kubepods": "200000 100000"}, 2),  # tightest
        ({"kubepods/pod/ctr": "max 100000"}, None),
        ({"kubepods/pod/ctr": "max 100000", "kubepods/pod": "300000 100000"}, 3),
        ({"": "200000 50000"}, 4),  # a container's own root (cgroup namespace)
        ({}, None),
        ({"kubepods/pod/ctr": "garbage"}, None),
        ({"kubepods/pod/ctr": "0 100000"}, None),
    ],
)
def test_the_cgroup_v2_quota_caps_the_cores(
    tmp_path: Path, quotas: dict[str, str], expected: int | None
) -> None:
    where = _cgroups(tmp_path, "0::/kubepods/pod/ctr\n", quotas)
    assert cgroup_cpu_limit(**where) == expected


def test_cgroup_v1_only_or_no_proc_file_sets_no_limit(tmp_path: Path) -> None:
    v1 = _cgroups(tmp_path, "12:cpu,cpuacct:/docker/abc\n", {"docker/abc": "100000 100000"})
    assert cgroup_cpu_limit(**v1) is None
    missing = {"cgroup_root": tmp_path, "proc_cgroup": tmp_path / "absent"}
    assert cgroup_cpu_limit(**missing) is None


def test_usable_cores_are_the_affinity_capped_by_the_quota(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    generous = _cgroups(tmp_path, "0::/a\n", {"a": f"{(cores + 8) * 100000} 100000"})
    assert usable_cores(**generous) == cores
    (tmp_path / "cgroup" / "a" / "cpu.max").write_text("10000 100000\n")  # 0.1 CPU
    assert usable_cores(**generous) == 1


# -- the backoff ---------------------------------------------------------------------------


def test_quick_failures_double_the_wait_up_to_thirty_seconds() -> None:
    policy = RestartPolicy()
    delays, failures = [], 0
    for _ in range(8):
        delay, failures = policy.after_exit(failures, ran_s=0.5)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]


def test_a_child_that_ran_a_minute_starts_the_backoff_afresh() -> None:
    policy = RestartPolicy()
    _, failures = policy.after_exit(5, ran_s=59.9)
    assert failures == 6
    delay, failures = policy.after_exit(failures, ran_s=60.0)
    assert (delay, failures) == (1.0, 1)


# -- the children's command and environment ------------------------------------------------


def _config(tmp_path: Path, model_path: Path, kafka: str = "", metrics: str = "") -> Path:
    path = tmp_path / "worker.toml"
    path.write_text(f"""
shutdown_timeout_s = 12
[kafka]
{kafka}
[[pipelines]]
name = "p"
request_topics = ["a"]
result_topic = "b"
dead_letter_topic = "c"
[pipelines.features]
fields = ["f0"]
[pipelines.model]
path = "{model_path}"
name = "m"
{metrics}
""")
    return path


def _plan(tmp_path: Path, model_path: Path, **options: str) -> SupervisorPlan:
    path = _config(tmp_path, model_path, **options)
    config = parse_config(tomllib.loads(path.read_text()), environ={})
    env = {"PATH": "/bin", PROCESSES_ENV: "4", "STREAMFER_METRICS__PORT": "9464"}
    return plan_for(config, path, 3, burst_idle_s=None, environ=env)


def test_children_run_the_same_command_without_processes(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    path = _config(tmp_path, model)
    config = parse_config(tomllib.loads(path.read_text()), environ={})
    plan = plan_for(config, path, 2, burst_idle_s=2.5, environ={})
    assert plan.command == (
        sys.executable,
        *("-m", "worker", "run", "--config", str(path), "--burst-idle-s", "2.5"),
    )
    assert plan.burst
    assert plan.stop_timeout_s == 12 + 15  # the drain's timeout, and time to leave the group
    assert not plan.child_metrics
    assert plan_for(config, path, 2, burst_idle_s=None, environ={}).burst is False


def test_each_child_knows_its_index_port_and_member_id(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    plan = _plan(
        tmp_path,
        model,
        kafka='group_instance_id = "host-a"',
        metrics="[metrics]\nhost = '0.0.0.0'\nport = 9464",
    )
    assert plan.child_metrics
    env = child_environment(plan, 1, 41234, supervisor_pid=77)
    assert env[PROCESS_INDEX_ENV] == "1"
    assert env[SUPERVISOR_PID_ENV] == "77"
    assert env["STREAMFER_METRICS__HOST"] == "127.0.0.1"
    assert env["STREAMFER_METRICS__PORT"] == "41234"
    # two members with one group.instance.id would fence each other
    assert env["STREAMFER_KAFKA__GROUP_INSTANCE_ID"] == "host-a-1"
    assert PROCESSES_ENV not in env  # a child never supervises in turn
    assert env["PATH"] == "/bin"


def test_without_metrics_or_static_membership_nothing_is_added(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    plan = _plan(tmp_path, model)
    env = child_environment(plan, 0, None, supervisor_pid=77)
    assert "STREAMFER_KAFKA__GROUP_INSTANCE_ID" not in env
    assert env["STREAMFER_METRICS__PORT"] == "9464"  # the caller's own, untouched
    assert "STREAMFER_METRICS__HOST" not in env


def test_a_child_asks_for_sigterm_when_its_supervisor_dies(tmp_path: Path) -> None:
    script = (
        "import ctypes, os, sys\n"
        "from worker.ops.supervisor import follow_supervisor\n"
        "ok = follow_supervisor({'STREAMFER_SUPERVISOR_PID': sys.argv[1]})\n"
        "sig = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)\n"  # PR_GET_PDEATHSIG
        "print(ok, sig.value)\n"
    )
    run = [sys.executable, "-c", script]
    mine = subprocess.run([*run, str(os.getpid())], capture_output=True, text=True, check=True)
    assert mine.stdout.split() == ["True", "15"]
    other = subprocess.run([*run, "1"], capture_output=True, text=True, check=True)
    assert other.stdout.split()[0] == "False"  # its parent is not that supervisor
    assert follow_supervisor({}) is True  # not supervised: nothing to follow


# -- the policy, with scripts for children -------------------------------------------------

CHILD = """
import os, pathlib, signal, sys, time
index = os.environ["STREAMFER_PROCESS_INDEX"]
folder = pathlib.Path(sys.argv[1])
starts = folder / f"starts-{index}"
n = int(starts.read_text()) if starts.exists() else 0
behaviour = sys.argv[2 + int(index)].split(",")
action = behaviour[min(n, len(behaviour) - 1)]
def drain(signum, frame):
    (folder / f"terminated-{index}").write_text("yes")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if action == "stubborn" else drain)
(folder / f"starts-{index}.new").write_text(str(n + 1))
os.replace(folder / f"starts-{index}.new", starts)
action, _, after = action.partition("@")
while after and not (folder / f"starts-{after}").exists():
    time.sleep(0.01)
if action.startswith("exit"):
    sys.exit(int(action[4:]))
while True:
    time.sleep(0.05)
"""
"""Each child does what its argument says on its n-th start (the last one repeats):
``exitC`` exits with C; ``serve`` runs until SIGTERM, then exits 0; ``stubborn`` ignores
SIGTERM; ``@K`` after one waits until child K has started. It counts its starts in a file
once its signal handler is in place."""

FAST = RestartPolicy(first_delay_s=0.05, max_delay_s=0.2, healthy_after_s=60)


def _supervisor(
    tmp_path: Path,
    *behaviours: str,
    burst: bool = False,
    stop_timeout_s: float = 30.0,
    restart: RestartPolicy = FAST,
) -> tuple[Supervisor, CollectorRegistry]:
    plan = SupervisorPlan(
        processes=len(behaviours),
        command=(sys.executable, "-c", CHILD, str(tmp_path), *behaviours),
        environ=dict(os.environ),
        child_metrics=False,
        group_instance_id=None,
        stop_timeout_s=stop_timeout_s,
        burst=burst,
        restart=restart,
    )
    registry = CollectorRegistry()
    return Supervisor(plan, registry, tick_s=0.02), registry


def _starts(tmp_path: Path, index: int) -> int:
    path = tmp_path / f"starts-{index}"
    return int(path.read_text()) if path.exists() else 0


def _restarts(registry: CollectorRegistry, index: int) -> float | None:
    return registry.get_sample_value("streamfer_supervisor_restarts_total", {"process": str(index)})


def _wait(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def in_background() -> Iterator[Callable[[Supervisor], dict[str, int]]]:
    """Run a supervisor on a thread; its exit code lands in the returned dict."""
    threads: list[tuple[threading.Thread, Supervisor]] = []

    def start(supervisor: Supervisor) -> dict[str, int]:
        out: dict[str, int] = {}
        thread = threading.Thread(target=lambda: out.update(code=supervisor.run()))
        thread.start()
        threads.append((thread, supervisor))
        return out

    yield start
    for thread, supervisor in threads:
        supervisor.signalled()
        supervisor.signalled()
        thread.join(30)


def test_a_crashed_child_is_started_again_and_burst_mode_ends_when_all_finish(
    tmp_path: Path,
) -> None:
    supervisor, registry = _supervisor(tmp_path, "exit0", "exit1,exit1,exit0", burst=True)
    assert supervisor.run() == 0
    assert [_starts(tmp_path, 0), _starts(tmp_path, 1)] == [1, 3]
    assert [_restarts(registry, 0), _restarts(registry, 1)] == [0, 2]
    assert [c.state for c in supervisor.children()] == ["done", "done"]


def test_a_child_that_refuses_its_config_stops_everything_with_exit_2(tmp_path: Path) -> None:
    supervisor, registry = _supervisor(tmp_path, "serve", "exit2@0")
    started = time.monotonic()
    assert supervisor.run() == 2
    assert time.monotonic() - started < 10
    assert _starts(tmp_path, 1) == 1  # never started again
    assert _restarts(registry, 1) == 0
    assert (tmp_path / "terminated-0").exists()  # the other one was drained


def test_a_signal_drains_every_child_and_exits_0(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    supervisor, _ = _supervisor(tmp_path, "serve", "serve")
    out = in_background(supervisor)
    assert _wait(lambda: _starts(tmp_path, 0) == 1 and _starts(tmp_path, 1) == 1)
    assert [c.state for c in supervisor.children()] == ["running", "running"]
    supervisor.signalled()
    assert _wait(lambda: "code" in out)
    assert out["code"] == 0
    assert (tmp_path / "terminated-0").exists() and (tmp_path / "terminated-1").exists()
    assert supervisor.stopping
    assert [c.exit_code for c in supervisor.children()] == [0, 0]


def test_a_child_waiting_to_restart_is_shown_so_and_not_started_by_a_stop(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    slow = RestartPolicy(first_delay_s=60, max_delay_s=60, healthy_after_s=60)
    supervisor, registry = _supervisor(tmp_path, "exit3", "serve", restart=slow)
    out = in_background(supervisor)
    assert _wait(lambda: supervisor.children()[0].state == "restarting")
    assert _wait(lambda: _starts(tmp_path, 1) == 1)  # its SIGTERM handler is in place
    child = supervisor.children()[0]
    assert (child.exit_code, child.restarts, child.exit_text()) == (3, 1, "exit code 3")
    assert _restarts(registry, 0) == 1
    supervisor.signalled()
    assert _wait(lambda: "code" in out)
    assert out["code"] == 0  # the one running drained cleanly
    assert _starts(tmp_path, 0) == 1


def test_a_child_exiting_0_outside_burst_mode_is_started_again(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    supervisor, registry = _supervisor(tmp_path, "exit0,serve")
    out = in_background(supervisor)
    assert _wait(lambda: _starts(tmp_path, 0) == 2)
    assert _wait(lambda: supervisor.children()[0].state == "running")
    assert _restarts(registry, 0) == 1
    supervisor.signalled()
    assert _wait(lambda: "code" in out)
    assert out["code"] == 0


def test_children_that_outlast_the_stop_timeout_are_killed(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    supervisor, _ = _supervisor(tmp_path, "stubborn", "serve", stop_timeout_s=1.0)
    out = in_background(supervisor)
    assert _wait(lambda: _starts(tmp_path, 0) == 1 and _starts(tmp_path, 1) == 1)
    supervisor.signalled()
    assert _wait(lambda: "code" in out, timeout=15)
    assert out["code"] == 1
    assert supervisor.children()[0].exit_text() == "exit code -9: SIGKILL"
    assert supervisor.children()[1].exit_code == 0


def test_a_second_signal_kills_the_children_at_once(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    supervisor, _ = _supervisor(tmp_path, "stubborn", stop_timeout_s=600)
    out = in_background(supervisor)
    assert _wait(lambda: _starts(tmp_path, 0) == 1)
    supervisor.signalled()
    assert _wait(lambda: supervisor.stopping)
    assert supervisor.children()[0].state == "running"  # waiting for a drain that never comes
    supervisor.signalled()
    assert _wait(lambda: "code" in out, timeout=10)
    assert out["code"] == 1
    assert supervisor.children()[0].exit_code == -9


HUP_CHILD = """
import os, pathlib, signal, sys, time
index = os.environ["STREAMFER_PROCESS_INDEX"]
folder = pathlib.Path(sys.argv[1])
blocked = signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, set())
(folder / f"blocked-{index}.tmp").write_text(str(blocked))
os.replace(folder / f"blocked-{index}.tmp", folder / f"blocked-{index}")  # whole or absent
time.sleep(float(sys.argv[2]))  # a slow start: models loading, say
def hup(signum, frame):
    with (folder / f"hups-{index}").open("a") as fh:
        fh.write("hup\\n")
signal.signal(signal.SIGHUP, hup)
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
(folder / f"ready-{index}").write_text("yes")
while True:
    time.sleep(0.05)
"""
"""A worker as ``worker.cli`` starts one: SIGHUP handled (counted in a file) once its
handler is installed, after ``sys.argv[2]`` seconds, and unblocked only then."""


def _hups(tmp_path: Path, index: int) -> int:
    path = tmp_path / f"hups-{index}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _hup_supervisor(tmp_path: Path, processes: int, start_s: float) -> Supervisor:
    plan = SupervisorPlan(
        processes=processes,
        command=(sys.executable, "-c", HUP_CHILD, str(tmp_path), str(start_s)),
        environ=dict(os.environ),
        child_metrics=False,
        group_instance_id=None,
        stop_timeout_s=30,
        burst=False,
        restart=FAST,
    )
    return Supervisor(plan, CollectorRegistry(), tick_s=0.02)


def test_a_reload_request_reaches_every_running_child_as_sighup(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    supervisor = _hup_supervisor(tmp_path, 2, 0.0)
    out = in_background(supervisor)
    assert _wait(lambda: all((tmp_path / f"ready-{i}").exists() for i in (0, 1)))
    assert supervisor.request_reload() == "reload requested of 2 worker processes"
    assert _wait(lambda: _hups(tmp_path, 0) == 1 and _hups(tmp_path, 1) == 1)
    supervisor.request_reload()
    assert _wait(lambda: _hups(tmp_path, 0) == 2 and _hups(tmp_path, 1) == 2)
    supervisor.signalled()
    assert _wait(lambda: "code" in out)
    assert out["code"] == 0


def test_a_sighup_before_a_child_handles_it_waits_instead_of_killing_it(
    tmp_path: Path, in_background: Callable[[Supervisor], dict[str, int]]
) -> None:
    """Children start with SIGHUP blocked (the supervisor's own mask is untouched): one
    forwarded while a child still loads is delivered once its handler is there."""
    supervisor = _hup_supervisor(tmp_path, 1, 1.5)
    out = in_background(supervisor)
    assert _wait(lambda: (tmp_path / "blocked-0").exists())
    assert (tmp_path / "blocked-0").read_text() == "True"
    assert not (tmp_path / "ready-0").exists()
    supervisor.request_reload()
    assert _wait(lambda: _hups(tmp_path, 0) == 1)
    (child,) = supervisor.children()
    assert (child.state, child.restarts) == ("running", 0)
    assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    supervisor.signalled()
    assert _wait(lambda: "code" in out)
    assert out["code"] == 0

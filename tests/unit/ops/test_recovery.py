"""Recoveries: a worker starts itself again in place, counted, after a backoff."""

from __future__ import annotations

import logging
import signal

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes.clock import FakeClock
from worker.ops import RECOVERY_ENV, Recoveries
from worker.ops.recovery import RecoveryRecord


class _Exec:
    """Records the new image it was asked for, as ``os.execve`` would replace us."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, list[str], dict[str, str]]] = []
        self.fail = fail

    def __call__(self, path: str, argv: list[str], env: dict[str, str]) -> None:
        self.calls.append((path, list(argv), dict(env)))
        if self.fail:
            raise OSError("no such file")


def _recoveries(
    environ: dict[str, str],
    clock: FakeClock,
    execve: _Exec,
    registry: CollectorRegistry | None = None,
) -> Recoveries:
    return Recoveries(
        environ,
        registry or CollectorRegistry(),
        clock=clock,
        sleep=clock.sleep,
        execve=execve,
        argv=["/usr/bin/python3", "-m", "worker", "run", "--config", "w.toml"],
    )


def _count(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("streamfer_recoveries_total", {"reason": "call_stalled"})


def test_the_record_reads_back_what_it_wrote_and_ignores_anything_else() -> None:
    record = RecoveryRecord({"call_stalled": 3}, quick=2)
    assert RecoveryRecord.parse(record.encode()) == record
    junk = RecoveryRecord.parse("quick=x;call_stalled=-1;other=4;;=;call_stalled")
    assert junk == RecoveryRecord()


def test_a_fresh_worker_shows_no_recovery_and_a_restarted_one_its_count() -> None:
    fresh = CollectorRegistry()
    _recoveries({}, FakeClock(), _Exec(), fresh)
    assert _count(fresh) == 0.0
    again = CollectorRegistry()
    _recoveries({RECOVERY_ENV: "quick=1;call_stalled=2"}, FakeClock(), _Exec(), again)
    assert _count(again) == 2.0


def test_a_recovery_waits_the_backoff_then_starts_the_same_command_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, execve = FakeClock(), _Exec()
    recoveries = _recoveries({"PATH": "/bin"}, clock, execve)
    with caplog.at_level(logging.WARNING):
        recoveries.restart("call_stalled", "send_offsets_to_transaction stalled", lambda: False)
    assert sum(clock.slept) == pytest.approx(1.0)
    [(path, argv, env)] = execve.calls
    assert path == "/usr/bin/python3"
    assert argv == ["/usr/bin/python3", "-m", "worker", "run", "--config", "w.toml"]
    assert env["PATH"] == "/bin"
    assert RecoveryRecord.parse(env[RECOVERY_ENV]) == RecoveryRecord({"call_stalled": 1}, 1)
    [line] = [r for r in caplog.records if r.name == "worker.ops.recovery"]
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert "recovering by itself (call_stalled, recovery 1)" in line.getMessage()
    assert "send_offsets_to_transaction stalled" in line.getMessage()


def test_quick_recoveries_back_off_and_a_long_run_starts_the_backoff_afresh() -> None:
    clock, execve = FakeClock(), _Exec()
    _recoveries({RECOVERY_ENV: "quick=3;call_stalled=3"}, clock, execve).restart(
        "call_stalled", "stalled", lambda: False
    )
    assert sum(clock.slept) == pytest.approx(8.0)  # 1 s doubled three times
    assert RecoveryRecord.parse(execve.calls[0][2][RECOVERY_ENV]).quick == 4

    clock, execve = FakeClock(), _Exec()
    recoveries = _recoveries({RECOVERY_ENV: "quick=6;call_stalled=6"}, clock, execve)
    clock.now += 61.0  # served a minute before this one
    recoveries.restart("call_stalled", "stalled", lambda: False)
    assert sum(clock.slept) == pytest.approx(1.0)
    record = RecoveryRecord.parse(execve.calls[0][2][RECOVERY_ENV])
    assert record == RecoveryRecord({"call_stalled": 7}, 1)


def test_the_backoff_never_passes_thirty_seconds() -> None:
    clock, execve = FakeClock(), _Exec()
    _recoveries({RECOVERY_ENV: "quick=40;call_stalled=40"}, clock, execve).restart(
        "call_stalled", "stalled", lambda: False
    )
    assert sum(clock.slept) == pytest.approx(30.0)


def test_a_signal_during_the_backoff_stops_instead_of_starting_again() -> None:
    clock, execve = FakeClock(), _Exec()
    recoveries = _recoveries({RECOVERY_ENV: "quick=2;call_stalled=2"}, clock, execve)
    recoveries.restart("call_stalled", "stalled", lambda: clock.now >= 101.0)
    assert execve.calls == []
    assert sum(clock.slept) < 4.0


def test_a_new_image_that_cannot_start_is_logged_and_handed_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, execve = FakeClock(), _Exec(fail=True)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with caplog.at_level(logging.ERROR):
        _recoveries({}, clock, execve).restart("call_stalled", "stalled", lambda: False)
    assert len(execve.calls) == 1
    assert "cannot start again in place" in caplog.text
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # SIGHUP as it was


def test_each_reason_is_counted_apart() -> None:
    clock, execve = FakeClock(), _Exec()
    environ = {RECOVERY_ENV: "quick=0;call_stalled=2"}
    _recoveries(environ, clock, execve).restart(
        "producer_unusable", "fenced after the transaction timed out", lambda: False
    )
    registry = CollectorRegistry()
    _recoveries(execve.calls[0][2], FakeClock(), _Exec(), registry)
    assert _count(registry) == 2.0
    fenced = {"reason": "producer_unusable"}
    assert registry.get_sample_value("streamfer_recoveries_total", fenced) == 1.0


def test_a_fenced_member_is_a_reason_of_its_own() -> None:
    clock, execve = FakeClock(), _Exec()
    _recoveries({}, clock, execve).restart(
        "member_fenced", "fenced after its session timed out", lambda: False
    )
    registry = CollectorRegistry()
    _recoveries(execve.calls[0][2], FakeClock(), _Exec(), registry)
    fenced = {"reason": "member_fenced"}
    assert registry.get_sample_value("streamfer_recoveries_total", fenced) == 1.0
    assert _count(registry) == 0.0

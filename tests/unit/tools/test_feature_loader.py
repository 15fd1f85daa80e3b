"""The progress line of ``streamfer features load`` (the loading itself runs against real
Redis in tests/integration/test_feature_layouts.py)."""

from __future__ import annotations

import io

from tests.fakes.clock import FakeClock
from worker.tools.feature_loader import _RowProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_one_line_every_interval() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = _RowProgress(None, stream=out, clock=clock)
    bar.update(5000)
    assert out.getvalue() == "", "nothing before the first interval"
    clock.now += 5.0
    bar.update(10_000)
    clock.now += 1.0
    bar.update(15_000)
    bar.finish(15_000)
    assert out.getvalue().splitlines() == [
        "loading features 10,000 rows 2,000 rows/s",
        "loading features 15,000 rows 2,500 rows/s",
    ]


def test_progress_on_a_terminal_redraws_one_line_with_the_share() -> None:
    clock, out = FakeClock(), Terminal()
    bar = _RowProgress(40_000, stream=out, clock=clock)
    clock.now += 1.0
    bar.update(10_000)
    clock.now += 1.0
    bar.finish(40_000)
    assert out.getvalue() == (
        "\rloading features 10,000/40,000 rows  25.0% 10,000 rows/s\x1b[K"
        "\rloading features 40,000/40,000 rows 100.0% 20,000 rows/s\x1b[K\n"
    )

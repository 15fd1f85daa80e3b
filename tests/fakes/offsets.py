"""A topic's offsets without a broker, for the offset tools' tests."""

from __future__ import annotations

from collections.abc import Sequence

from worker.errors import ConfigError


class FakeLookup:
    """Topic ``t`` with 3 partitions; record timestamps are ``1000 * offset``."""

    def __init__(self, marks: dict[int, tuple[int, int]] | None = None) -> None:
        self.marks = marks or {0: (0, 10), 1: (4, 6), 2: (0, 0)}

    def partitions(self, topic: str) -> list[int]:
        if topic != "t":
            raise ConfigError(f"topic {topic!r} does not exist")
        return sorted(self.marks)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        return self.marks[partition]

    def offsets_for_time(
        self, topic: str, partitions: Sequence[int], time_ms: int
    ) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for p in partitions:
            low, high = self.marks[p]
            at = max(low, -(-time_ms // 1000))
            out[p] = at if at < high else None
        return out

"""The one error a framed request's decoding raises for the record itself (a module of
its own so that the JSON path imports no Schema Registry library)."""

from __future__ import annotations

__all__ = ["RecordUndecodable"]


class RecordUndecodable(Exception):
    """One record's value cannot be read as a request: ``code`` and ``reason`` for its
    dead letter."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason

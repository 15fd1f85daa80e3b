"""Two services started side by side must not be given one port."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from streamfer_dev import stack


class OfferedSocket:
    """A socket whose kernel offers the ports of ``offers`` in turn."""

    offers: itertools.cycle[int]

    def __init__(self, *args: Any) -> None:
        self.port = next(self.offers)

    def __enter__(self) -> OfferedSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_a_port_offered_twice_is_handed_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    OfferedSocket.offers = itertools.cycle([41001, 41001, 41002])
    monkeypatch.setattr(stack.socket, "socket", OfferedSocket)
    monkeypatch.setattr(stack, "_HANDED_OUT", set(), raising=False)
    assert [stack.free_port(), stack.free_port()] == [41001, 41002]

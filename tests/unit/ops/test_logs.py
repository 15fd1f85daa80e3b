"""Log lines of a worker a supervisor started carry its process index."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import orjson
import pytest

from worker.ops.logs import setup_logging


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_text_lines_name_the_process_index(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("text", process_index=3)
    logging.getLogger("streamfer").info("hello")
    assert f"[{os.getpid()} process 3] streamfer: hello" in capsys.readouterr().err
    setup_logging("text")
    logging.getLogger("streamfer").info("alone")
    assert f"[{os.getpid()}] streamfer: alone" in capsys.readouterr().err


def test_json_lines_carry_the_process_index(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("json", process_index=0)
    logging.getLogger("streamfer").warning("hello")
    doc = orjson.loads(capsys.readouterr().err.splitlines()[-1])
    assert doc["process"] == 0 and doc["msg"] == "hello"
    setup_logging("json")
    logging.getLogger("streamfer").warning("alone")
    assert "process" not in orjson.loads(capsys.readouterr().err.splitlines()[-1])

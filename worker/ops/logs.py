"""Logging set-up: text for a terminal, JSON lines for collectors."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import orjson

__all__ = ["setup_logging"]


class _JsonFormatter(logging.Formatter):
    def __init__(self, process_index: int | None = None) -> None:
        super().__init__()
        self._process_index = process_index

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self._process_index is not None:
            doc["process"] = self._process_index
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


_PER_REQUEST_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
"""The Schema Registry client's HTTP libraries log every request at INFO."""


def setup_logging(
    fmt: Literal["text", "json"] = "text",
    level: int = logging.INFO,
    *,
    process_index: int | None = None,
) -> None:
    """Log to stderr. ``process_index`` is a supervised worker's index, in every line."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter(process_index))
    else:
        where = "%(process)d" if process_index is None else f"%(process)d process {process_index}"
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s [{where}] %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for chatty in _PER_REQUEST_LOGGERS:
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))

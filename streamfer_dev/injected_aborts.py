"""Fault injection for the fault harness: transactions aborted on the broker.

``python -m streamfer_dev.injected_aborts EVERY run --config ...`` is ``streamfer`` with
every EVERY-th ``commit_transaction`` of each transactional producer refused as an
abortable error before it reaches the broker, so the worker aborts that transaction and
rewinds, as it would after a real abortable failure. The wrapper is installed here, in the
harness's own process entry point; the worker's code has no switch for it.
"""

from __future__ import annotations

import sys
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

import worker.kafka.transactions
from worker.cli import main

__all__ = ["AbortingProducer", "install"]


class AbortingProducer(Producer):
    """A producer whose every ``every``-th transaction commit fails as abortable."""

    every = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._commits = 0

    def commit_transaction(self, *args: Any) -> None:
        self._commits += 1
        if self.every and self._commits % self.every == 0:
            raise KafkaException(
                KafkaError(KafkaError._INVALID_ARG, "injected abort", txn_requires_abort=True)
            )
        super().commit_transaction(*args)


def install(every: int) -> None:
    """Make every transactional producer the worker builds an ``AbortingProducer``."""
    AbortingProducer.every = every
    worker.kafka.transactions.Producer = AbortingProducer  # type: ignore[attr-defined]


if __name__ == "__main__":
    install(int(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))

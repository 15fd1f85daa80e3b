"""Waiting out a feature store that cannot enrich a batch as a whole.

An outage (FeatureStoreError) is retried with backoff, 0.1 s to 5 s, until the
pipeline's ``retry_feature_store_s`` passes; then it is raised. A refusal only an
operator can fix (FeatureStoreConfigError: NOPERM, credentials ...) is retried with
backoff up to 30 s and no deadline, logged when it changes and once a minute: no record
is at fault, so none is dead-lettered, and stopping would only hand the batch to a
worker that meets the same refusal. Problems of one entity are not errors here: they
come back from the fetch as rejections.

A Schema Registry that cannot give a batch its writers' schemas is waited out the same
way by a wait of its own (``outage = SchemaRegistryError``, ``what = "schema
registry"``): it is no fault of any record either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import Counter

from worker.core import Clock, Deadline, monotonic_clock
from worker.errors import FeatureStoreConfigError, FeatureStoreError

__all__ = ["StoreWait"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreWait:
    """Calls one pipeline's enrichment until the store answers, or it is time to give up.

    ``on_feature_store`` hears (False, reason) whenever the reason changes and
    (True, None) once the store answers again (readiness follows it); ``abort`` ends the
    wait by raising the last error. An outage is given up on once the next try would come
    past ``retry_s`` on ``clock``."""

    CONFIG_RETRY_S = (1.0, 30.0)
    """First and longest wait between tries while Redis refuses the configuration."""
    REPEAT_LOG_S = 60.0
    """How often an unchanged configuration refusal is logged again."""

    def __init__(
        self,
        pipeline: str,
        *,
        retry_s: float | None,
        abort: threading.Event,
        errors: Counter | None,
        on_feature_store: Callable[[bool, str | None], None],
        outage: type[Exception] = FeatureStoreError,
        what: str = "feature store",
        clock: Clock = monotonic_clock,
    ) -> None:
        self._pipeline = pipeline
        self._clock = clock
        self._outage = outage
        self._what = what
        self._retry_s = retry_s
        self._abort = abort
        self._errors = errors
        self._on_feature_store = on_feature_store

    def call(self, attempt: Callable[[], T]) -> T:
        """``attempt()``, again while it raises a feature store error (see the module)."""
        name = self._pipeline
        deadline = None if self._retry_s is None else Deadline.after(self._retry_s, self._clock)
        delay = 0.0
        problem: str | None = None
        logged: tuple[str, float] | None = None
        while True:
            try:
                answer = attempt()
            except (self._outage, FeatureStoreConfigError) as exc:
                if self._errors is not None:  # None: the caller counts its failures
                    self._errors.inc()
                config = isinstance(exc, FeatureStoreConfigError)
                first, longest = self.CONFIG_RETRY_S if config else (0.1, 5.0)
                delay = min(delay * 2, longest) if delay else first
                reason = str(exc)
                if reason != problem:
                    problem = reason
                    self._on_feature_store(False, reason)
                now = self._clock()
                out_of_time = not config and deadline is not None and deadline.remaining() < delay
                if out_of_time or self._abort.is_set():
                    raise
                if not config:
                    log.warning("pipeline %s: %s; retrying in %.1fs", name, exc, delay)
                elif logged is None or logged[0] != reason or now - logged[1] >= self.REPEAT_LOG_S:
                    logged = (reason, now)
                    log.error(
                        "pipeline %s: %s; the batch waits (no record is dead-lettered), "
                        "retrying in %.1fs",
                        name,
                        exc,
                        delay,
                    )
                self._abort.wait(delay)
                continue
            if problem is not None:
                log.info("pipeline %s: %s answers again", name, self._what)
                self._on_feature_store(True, None)
            return answer

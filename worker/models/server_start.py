"""Starting a pipeline whose inference server cannot answer yet.

A worker and the servers it calls are often started together (one deployment, one
restart of a node): a server still loading its models, or not yet reachable, is no
reason for the worker to exit and be restarted in a loop. So loading a pipeline's model
waits for its server: each ``InferenceServerError`` is reported (readiness names the
server, a log line says what the worker waits for) and the load is tried again with
backoff, 1 s doubling to 30 s, until the server answers. Anything else the load raises
(a model that does not fit, a config error) still ends start-up at once, and ``streamfer
check`` does not wait at all: it calls the loader directly and names the server.
A worker stopped meanwhile ends by its signal, before it has joined its group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from worker.errors import InferenceServerError

__all__ = ["when_served"]

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_S = (1.0, 30.0)
"""First and longest wait between tries."""


def when_served(
    load: Callable[[], T],
    *,
    pipeline: str,
    on_inference_server: Callable[[bool, str | None], None],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``load()``, tried again while it raises ``InferenceServerError`` (see the
    module); ``on_inference_server`` hears (False, why) for each new reason and
    (True, None) once the load went through after a wait. Blocks until then."""
    first, longest = RETRY_S
    delay = 0.0
    problem: str | None = None
    while True:
        try:
            loaded = load()
        except InferenceServerError as exc:
            delay = min(delay * 2, longest) if delay else first
            if str(exc) != problem:
                problem = str(exc)
                on_inference_server(False, problem)
                log.error(
                    "pipeline %s: %s; the worker waits for the server before it joins its "
                    "group (trying again every %.0f s at most)",
                    pipeline,
                    exc,
                    longest,
                )
            sleep(delay)
            continue
        if problem is not None:
            log.info("pipeline %s: the inference server answers; starting", pipeline)
            on_inference_server(True, None)
        return loaded

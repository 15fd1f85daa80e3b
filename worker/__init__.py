"""streamfer: a Kafka stream-processing inference worker.

Consume request records, micro-batch them, enrich them with features from Redis, run an
ONNX model once per batch, publish one result (or dead letter) per request, and commit
offsets only after every delivery of the batch succeeded. Start with ``Worker`` and
``load_config``; the command line is ``streamfer`` (``worker.cli``).
"""

from __future__ import annotations

from worker.core import __version__

__all__ = ["Worker", "WorkerConfig", "__version__", "load_config"]


def __getattr__(name: str) -> object:
    # Lazy, so ``import worker`` stays cheap and free of side effects.
    if name == "Worker":
        from worker.loop import Worker

        return Worker
    if name in ("WorkerConfig", "load_config"):
        from worker import config as config

        return getattr(config, name)
    raise AttributeError(name)

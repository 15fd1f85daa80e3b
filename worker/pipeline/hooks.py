"""Batch hooks: user Python called once per batch, around the model.

``[pipelines.hooks]`` names them as ``package.module:function``; they are imported at
start-up (a name that does not import is a configuration error, exit 2). ``prepare``
sees the batch's decoded requests and the assembled input arrays and returns the arrays
the model gets; ``postprocess`` sees the requests and the model's outputs (by result
field) and returns the result fields. Both run on the model's thread, between enrich
and publish, and never per record. A hook that raises, or returns something that is
not one array per input or field with one row per request, is treated like a model
error: the batch is retried in halves until the rows it fails on are found, and those
become dead letters (``model_error``), while the others publish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import orjson

from worker.config import HooksSpec, import_target
from worker.errors import ConfigError, EngineError

__all__ = ["BatchHooks", "PostprocessHook", "PrepareHook", "load_hooks"]

Arrays = dict[str, npt.NDArray[Any]]


class PrepareHook(Protocol):
    """``prepare(requests, inputs) -> inputs``: ``requests`` are the decoded JSON
    requests of the batch (the rows that reached the model, in order); ``inputs`` maps
    each model input name to its array, one row per request. Return the arrays the
    model gets, by input name, with one row per request."""

    def __call__(
        self, requests: Sequence[Mapping[str, Any]], inputs: Mapping[str, npt.NDArray[Any]]
    ) -> Mapping[str, npt.NDArray[Any]]: ...


class PostprocessHook(Protocol):
    """``postprocess(requests, outputs) -> fields``: ``outputs`` maps each result field
    to the model's array for it, one row per request. Return the result fields to
    publish, by name: arrays of numbers, bools or strings, one row per request."""

    def __call__(
        self, requests: Sequence[Mapping[str, Any]], outputs: Mapping[str, npt.NDArray[Any]]
    ) -> Mapping[str, npt.NDArray[Any]]: ...


@dataclass(frozen=True, slots=True)
class BatchHooks:
    """A pipeline's hooks, either of which may be absent."""

    prepare: PrepareHook | None = None
    postprocess: PostprocessHook | None = None

    @property
    def active(self) -> bool:
        return self.prepare is not None or self.postprocess is not None

    def before(self, requests: Sequence[Mapping[str, Any]], inputs: Arrays) -> Arrays:
        """``prepare``'s arrays, checked. Raises EngineError when it fails."""
        if self.prepare is None:
            return inputs
        rows = len(requests)
        got = _call("prepare", self.prepare, requests, inputs)
        return _checked("prepare", got, rows, required=inputs.keys())

    def after(self, requests: Sequence[Mapping[str, Any]], outputs: Arrays) -> Arrays:
        """``postprocess``'s fields, checked. Raises EngineError when it fails."""
        if self.postprocess is None:
            return outputs
        got = _call("postprocess", self.postprocess, requests, outputs)
        return _checked("postprocess", got, len(requests), required=())


def _call(name: str, hook: Any, requests: Sequence[Mapping[str, Any]], arrays: Arrays) -> Any:
    try:
        return hook(requests, arrays)
    except Exception as exc:  # a user's function may raise anything
        raise EngineError(f"{name} hook raised {type(exc).__name__}: {exc}") from exc


_PUBLISHABLE = frozenset("biufUO")


def _checked(name: str, got: Any, rows: int, required: Any) -> Arrays:
    if not isinstance(got, Mapping):
        raise EngineError(f"{name} hook returned {type(got).__name__}, not a dict of arrays")
    out: Arrays = {}
    for key, value in got.items():
        array = np.asarray(value)
        if array.ndim == 0 or len(array) != rows:
            raise EngineError(
                f"{name} hook returned {key!r} with shape {array.shape} for {rows} rows"
            )
        if array.dtype.kind not in _PUBLISHABLE:
            raise EngineError(f"{name} hook returned {key!r} of dtype {array.dtype}")
        if array.dtype.kind == "O":
            try:
                orjson.dumps(array.tolist())
            except (orjson.JSONEncodeError, TypeError) as exc:
                raise EngineError(f"{name} hook returned {key!r} holding {exc}") from exc
        out[str(key)] = array
    missing = [k for k in required if k not in out]
    if missing:
        raise EngineError(f"{name} hook returned no arrays for inputs {missing}")
    return out


def load_hooks(spec: HooksSpec, where: str) -> BatchHooks:
    """Import the configured hooks. Raises ConfigError naming the one that fails."""
    return BatchHooks(
        prepare=_load(spec.prepare, f"{where}.hooks.prepare"),
        postprocess=_load(spec.postprocess, f"{where}.hooks.postprocess"),
    )


def _load(target: str | None, field: str) -> Any:
    if target is None:
        return None
    hook = import_target(target, field)
    if not callable(hook):
        module_name, _, attr = target.partition(":")
        raise ConfigError(f"{field}: module {module_name!r} has no function {attr!r}")
    return hook

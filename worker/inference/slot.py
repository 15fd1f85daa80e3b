"""The model a pipeline serves now, and how one batch holds on to it.

A pipeline reads its ``ModelSlot`` once per batch, at the infer step (``for_batch``),
and the batch keeps that ``LiveModel`` until it is published: its results and dead
letters name the version that ran it, and a batch never mixes two versions.
``worker.models.reloader`` replaces the slot's model between two reads (``swap``), from its own
thread; the previous engine is then referenced only by the batches in flight that ran on
it, so it is released (reference counting, no bookkeeping) when the last of them has
been published.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.config import ModelSpec
from worker.inference.engine import InferenceEngine

__all__ = ["LiveModel", "ModelIdentity", "ModelSlot"]


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """What results and dead letters say about the model that ran them."""

    name: str
    version: str
    """The version directory's name, or the config's ``version`` for a plain file."""
    sha256: str
    meta: dict[str, str] = field(init=False, compare=False)
    """The result's ``model`` object."""
    tag: str = field(init=False, compare=False)
    """``name:version``, as dead letters carry it."""

    def __post_init__(self) -> None:
        meta = {"name": self.name, "version": self.version, "sha256": self.sha256}
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "tag", f"{self.name}:{self.version}")


@dataclass(frozen=True, slots=True)
class LiveModel:
    """An engine ready to serve and who it is."""

    engine: InferenceEngine
    identity: ModelIdentity

    @classmethod
    def of(cls, spec: ModelSpec, engine: InferenceEngine) -> LiveModel:
        """``spec``'s model on ``engine``: named by the version a server serves
        (``served_version``, which only the server knows) or else by the config's."""
        version = getattr(engine, "served_version", None) or spec.version
        return cls(engine, ModelIdentity(spec.name, str(version), engine.model_hash))


class ModelSlot:
    """Holds one pipeline's live model. ``for_batch`` and ``swap`` may be called from
    different threads: each is one reference read or write, atomic in CPython."""

    __slots__ = ("_live",)

    def __init__(self, live: LiveModel) -> None:
        self._live = live

    def for_batch(self) -> LiveModel:
        """The model one batch runs on: read once per batch, kept until its publish."""
        return self._live

    def swap(self, new: LiveModel) -> LiveModel:
        """Serve ``new`` from the next batch on; returns the model it replaces (the
        caller drops it, so that only the batches in flight keep it alive)."""
        old, self._live = self._live, new
        return old

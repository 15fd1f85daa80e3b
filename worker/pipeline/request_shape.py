"""Where things are in a JSON request, compiled once per pipeline for the decoder.

A request's id, its inline feature values and each lookup's entity id sit at dotted
paths (``[pipelines.request]``); the default shape is ``{"id", "entity", "features"}``.
Each feature also has a kind, from the model input it feeds: a ``text`` feature takes
JSON strings, a ``bool`` one true/false (or 0/1), every other one numbers. Paths are
split here, once, so decoding a record walks tuples of keys and nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from worker.config import PipelineConfig

__all__ = ["FeatureKind", "RequestShape"]

FeatureKind = Literal["number", "bool", "text"]

Path = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RequestShape:
    """The paths and feature kinds the decoder checks a request against.

    ``lookups`` lists, per lookup, its name, where its entity id is, and the features
    it stores (a request without that entity id must carry them all inline).
    """

    id_path: Path = ("id",)
    features_path: Path = ("features",)
    features_array: tuple[str, ...] | None = None
    lookups: tuple[tuple[str, Path, tuple[str, ...]], ...] = (("entity", ("entity",), ()),)
    kinds: Mapping[str, FeatureKind] = field(default_factory=dict)
    """Every feature a request may carry inline, by kind."""

    @classmethod
    def of(
        cls, config: PipelineConfig, kinds: Mapping[str, FeatureKind] | None = None
    ) -> RequestShape:
        """The shape of ``config``'s requests. ``kinds`` (from the feed plan) gives the kind
        of each feature the model uses; a request without a lookup's entity id must then
        carry only those of its features inline."""
        given = kinds or {}
        every = kinds is None
        names = list(config.stored_fields())
        names += list(config.request.features_array or ())
        names += [c for columns in (config.model.inputs or {}).values() for c in columns]
        request = config.request
        return cls(
            id_path=_split(request.id),
            features_path=_split(request.features),
            features_array=tuple(request.features_array) if request.features_array else None,
            lookups=tuple(
                (
                    lk.name,
                    _split(config.entity_path(lk.name)),
                    tuple(f for f in lk.fields if every or f in given),
                )
                for lk in config.lookups
            ),
            kinds={name: given.get(name, "number") for name in dict.fromkeys(names)},
        )

    @classmethod
    def simple(cls, fields: Collection[str]) -> RequestShape:
        """The default shape with one lookup (``entity``) storing ``fields``, all numbers."""
        return cls(
            lookups=(("entity", ("entity",), tuple(fields)),),
            kinds=dict.fromkeys(fields, "number"),
        )


def _split(path: str) -> Path:
    return tuple(path.split("."))

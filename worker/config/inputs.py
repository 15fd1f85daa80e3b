"""Where a pipeline's model inputs come from: the features each lookup reads from Redis
(``FeatureSpec``, ``LookupSpec``), the values and entity ids the request itself carries
(``RequestMapping``), and what a gap in either means (``MissingPolicy``)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from worker.config.base import Frozen

__all__ = ["FeatureSpec", "LookupSpec", "MissingPolicy", "RequestMapping"]

MissingPolicy = Literal["default", "dead_letter"]


class FeatureSpec(Frozen):
    """Which Redis hash holds an entity's features, which fields, and what a gap means."""

    key_template: str = "features:{entity}"
    fields: list[str] = Field(min_length=1)
    layout: Literal["hash", "packed"] = "hash"
    """hash: one Redis hash per entity, a field per feature (HMGET); packed: one string of
    little-endian float32 in ``fields`` order (MGET, decoded in one numpy call)."""
    on_missing_entity: MissingPolicy = "dead_letter"
    on_missing_field: MissingPolicy = "default"
    default_value: float = 0.0

    @model_validator(mode="after")
    def _template_names_entity(self) -> FeatureSpec:
        if "{entity}" not in self.key_template:
            raise ValueError("key_template must contain '{entity}'")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError("fields must not repeat")
        return self


class LookupSpec(FeatureSpec):
    """One feature lookup of a request: the entity id found at ``request.entities[name]``
    (default: a field called ``name``) names the key. Every lookup of a batch shares
    one Redis round trip."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")


_PATH = r"^[^.\s]+(\.[^.\s]+)*$"
"""A dotted path into a JSON request: ``meta.request_id``."""


class RequestMapping(Frozen):
    """Where things are in a JSON request, as dotted paths.

    ``features`` holds inline values: an object ``name -> value``, or, with
    ``features_array``, an array of those features' values in that order. A feature that
    no lookup stores comes from the request alone; a request that lacks it follows
    ``on_missing_field``."""

    id: str = Field(default="id", pattern=_PATH)
    features: str = Field(default="features", pattern=_PATH)
    features_array: list[str] | None = Field(default=None, min_length=1)
    entities: dict[str, str] = Field(default_factory=dict)
    on_missing_field: MissingPolicy = "dead_letter"
    default_value: float = 0.0

    @model_validator(mode="after")
    def _paths_are_paths(self) -> RequestMapping:
        for name, path in self.entities.items():
            if not re.fullmatch(_PATH, path):
                raise ValueError(f"entities.{name}: {path!r} is not a dotted path")
        if self.features_array is not None and len(set(self.features_array)) != len(
            self.features_array
        ):
            raise ValueError("features_array must not repeat a name")
        return self

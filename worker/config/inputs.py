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

    key_template: str = Field(
        default="features:{entity}",
        description=(
            "The Redis key of an entity's features; {entity} is replaced by the "
            "request's entity id."
        ),
    )
    fields: list[str] = Field(
        min_length=1, description="The features this lookup stores, in column order."
    )
    layout: Literal["hash", "packed"] = Field(
        default="hash",
        description=(
            "hash: one Redis hash per entity, a field per feature (HMGET); packed: "
            "one string of little-endian float32 in `fields` order (MGET, decoded "
            "in one numpy call)."
        ),
    )
    on_missing_entity: MissingPolicy = Field(
        default="dead_letter",
        description=(
            "A key that does not exist: the request's dead letter (unknown_entity),"
            " or default_value for every feature."
        ),
    )
    on_missing_field: MissingPolicy = Field(
        default="default",
        description=(
            "A feature missing from an existing key: default_value, or the "
            "request's dead letter (missing_feature)."
        ),
    )
    default_value: float = Field(
        default=0.0,
        description=(
            "The value a missing feature takes when its on_missing_* rule says "
            'default (a missing string is "").'
        ),
    )

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

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=(
            "The lookup's name: requests carry its entity id in a field of this "
            "name, unless [pipelines.request.entities] maps it elsewhere."
        ),
    )


_PATH = r"^[^.\s]+(\.[^.\s]+)*$"
"""A dotted path into a JSON request: ``meta.request_id``."""


class RequestMapping(Frozen):
    """Where things are in a JSON request, as dotted paths.

    ``features`` holds inline values: an object ``name -> value``, or, with
    ``features_array``, an array of those features' values in that order. A feature that
    no lookup stores comes from the request alone; a request that lacks it follows
    ``on_missing_field``."""

    id: str = Field(
        default="id", pattern=_PATH, description="Dotted path of the request id in a request."
    )
    features: str = Field(
        default="features",
        pattern=_PATH,
        description="Dotted path of the inline features, an object of name -> value.",
    )
    features_array: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Read inline features from an array at the features path instead, these"
            " features in this order."
        ),
    )
    entities: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Lookup name -> dotted path of its entity id; default: a field named after the lookup."
        ),
    )
    on_missing_field: MissingPolicy = Field(
        default="dead_letter",
        description=(
            "A feature that no lookup stores and the request does not carry: the "
            "request's dead letter (missing_feature), or default_value."
        ),
    )
    default_value: float = Field(
        default=0.0,
        description=('The value such a missing feature takes with on_missing_field = "default".'),
    )

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

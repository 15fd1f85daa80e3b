"""What every settings model shares: frozen once validated, no unknown keys, numbers
accepted where text is expected; and the rule several of them check, that no member
sits in two groups (a feature in two lookups, a topic in two pipelines)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen", "owners"]


class Frozen(BaseModel):
    """The base of every settings model: immutable once validated, and a key the model
    does not know is an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)


def owners(groups: Iterable[tuple[str, Iterable[str]]], what: str, kind: str) -> dict[str, str]:
    """Member -> the group that has it; a member in two groups is a ValueError."""
    owner: dict[str, str] = {}
    for name, members in groups:
        for member in members:
            if member in owner:
                raise ValueError(f"{what} {member!r} is in {kind} {owner[member]!r} and {name!r}")
            owner[member] = name
    return owner

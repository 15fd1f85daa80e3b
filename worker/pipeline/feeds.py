"""From decoded requests and their lookups to the model's input arrays, once per batch.

``FeedPlan`` is fixed when the model loads: which features fill which columns of which
model input, and each input's dtype (from the model). ``FeedPlan.build`` checks the
config against the model's signature and raises ``ModelMismatchError`` naming what does
not fit. ``assemble`` then works per batch: one fetch for every lookup (a single Redis
round trip, ``worker.features.lookups``), numbers gathered into one float64 matrix and strings
into one object matrix, inline values written over stored ones by feature name, and
each input cut out and converted to its dtype with one numpy call. A value that cannot
take its input's dtype (``bad_feature_value``), is not finite (``non_finite``) or is
missing where the policy says so refuses its row only: ``Assembled.rejected``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from worker.config import LookupSpec, MissingPolicy, PipelineConfig
from worker.core import DecodedRequests
from worker.errors import FeatureStoreError, ModelMismatchError
from worker.features import Fetched
from worker.inference import TensorInput
from worker.pipeline.request_shape import FeatureKind

__all__ = ["Assembled", "BatchFetcher", "FeedPlan", "InputFeed", "assemble"]

Feeds = dict[str, npt.NDArray[Any]]
Rejected = tuple[int, str, str]


class BatchFetcher(Protocol):
    """Fetches every lookup of a batch at once: lookup name -> distinct entities."""

    def fetch_all(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, Fetched]:
        """Raises FeatureStoreError (an outage) or FeatureStoreConfigError."""
        ...


@dataclass(frozen=True, slots=True)
class InputFeed:
    """One model input: its dtype and the features that fill its columns, in order."""

    name: str
    onnx_type: str
    dtype: np.dtype[Any]
    rank: int
    columns: tuple[str, ...]
    matrix: tuple[int, ...]
    """Positions of ``columns`` in the batch's number (or, for strings, text) matrix."""

    @property
    def kind(self) -> FeatureKind:
        return "text" if self.dtype.kind == "O" else "bool" if self.dtype.kind == "b" else "number"


@dataclass(frozen=True, slots=True)
class LookupColumns:
    """Where one lookup's fields go in a batch's matrices, fixed with the plan so that a
    batch computes none of it."""

    used: tuple[str, ...]
    """The lookup's fields some input reads, in its order."""
    number_src: npt.NDArray[np.intp]
    """Positions, among the lookup's fields, of those held as numbers ..."""
    number_dst: npt.NDArray[np.intp]
    """... and their columns in the number matrix."""
    every_number: bool
    """The lookup's fields are the number matrix's columns, all of them and in order."""
    text_src: npt.NDArray[np.intp]
    """Positions, among the lookup's fields, of those held as strings ..."""
    text_dst: npt.NDArray[np.intp]
    """... and their columns in the text matrix."""

    @classmethod
    def of(
        cls, lookup: LookupSpec, column: Mapping[str, int], text_column: Mapping[str, int]
    ) -> LookupColumns:
        fields = lookup.fields
        num = [(j, column[f]) for j, f in enumerate(fields) if f in column]
        txt = [(j, text_column[f]) for j, f in enumerate(fields) if f in text_column]
        dst = [c for _, c in num]
        return cls(
            used=tuple(f for f in fields if f in column or f in text_column),
            number_src=np.asarray([j for j, _ in num], dtype=np.intp),
            number_dst=np.asarray(dst, dtype=np.intp),
            every_number=len(column) == len(fields) and dst == list(range(len(fields))),
            text_src=np.asarray([j for j, _ in txt], dtype=np.intp),
            text_dst=np.asarray([c for _, c in txt], dtype=np.intp),
        )


@dataclass(frozen=True, slots=True)
class FeedPlan:
    """Which features fill which model inputs; fixed when the model loads."""

    inputs: tuple[InputFeed, ...]
    lookups: tuple[LookupSpec, ...]
    numbers: tuple[str, ...]
    """Features held as numbers, in the order of the batch's number matrix."""
    texts: tuple[str, ...]
    """Features held as strings, in the order of the batch's text matrix."""
    number_defaults: npt.NDArray[np.float64]
    request_only: tuple[str, ...]
    """Features no lookup stores: only a request carries them."""
    on_missing: MissingPolicy
    kinds: dict[str, FeatureKind] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    """Feature -> where it comes from: ``lookup NAME (layout)`` or ``request``."""
    column: dict[str, int] = field(default_factory=dict)
    """Number feature -> its column in the number matrix."""
    text_column: dict[str, int] = field(default_factory=dict)
    """String feature -> its column in the text matrix."""
    lookup_columns: dict[str, LookupColumns] = field(default_factory=dict)
    """Lookup name -> where its fields go."""

    @classmethod
    def build(cls, config: PipelineConfig, model: Sequence[TensorInput]) -> FeedPlan:
        """The plan for ``config``'s features and the model's inputs. Raises
        ModelMismatchError naming the input, width or type that does not fit."""
        where = f"pipeline {config.name!r}: model {config.model.where}"
        columns = _columns(config, model, where)
        kinds: dict[str, FeatureKind] = {}
        for t in model:
            if t.dtype is None:
                raise ModelMismatchError(
                    f"{where}: input {t.name!r} is {t.onnx_type}, which the worker cannot "
                    f"feed; it feeds {sorted({k.removeprefix('tensor(')[:-1] for k in _FEEDABLE})}"
                )
            if t.rank not in (1, 2):
                raise ModelMismatchError(
                    f"{where}: input {t.name!r} has rank {t.rank}; the worker feeds rank 2 "
                    "[batch, features] (or rank 1 [batch] with one feature)"
                )
            wanted = columns[t.name]
            width = 1 if t.rank == 1 else t.width
            if width is not None and width != len(wanted):
                raise ModelMismatchError(
                    f"{where}: input {t.name!r} ({t.describe()}) takes {width} columns but "
                    f"{len(wanted)} features feed it: {wanted}"
                )
            kind: FeatureKind = (
                "text" if t.dtype.kind == "O" else "bool" if t.dtype.kind == "b" else "number"
            )
            for name in wanted:
                if kinds.setdefault(name, kind) != kind and "text" in (kind, kinds[name]):
                    raise ModelMismatchError(
                        f"{where}: feature {name!r} feeds a string input and a numeric one"
                    )
        owner = {f: lk for lk in config.lookups for f in lk.fields}
        for name, kind in kinds.items():
            lookup = owner.get(name)
            if kind == "text" and lookup is not None and lookup.layout == "packed":
                raise ModelMismatchError(
                    f"{where}: feature {name!r} feeds a string input but lookup "
                    f"{lookup.name!r} is packed (float32 only); store it in a hash lookup"
                )
        texts = tuple(n for n, k in kinds.items() if k == "text")
        numbers = tuple(n for n, k in kinds.items() if k != "text")
        column = {name: j for j, name in enumerate(numbers)}
        text_column = {name: j for j, name in enumerate(texts)}
        at = column | text_column
        inputs = tuple(
            InputFeed(
                t.name,
                t.onnx_type,
                t.dtype,  # type: ignore[arg-type]  # checked above
                t.rank,
                tuple(columns[t.name]),
                tuple(at[c] for c in columns[t.name]),
            )
            for t in model
        )
        defaults = np.array(
            [
                owner[n].default_value if n in owner else config.request.default_value
                for n in numbers
            ],
            dtype=np.float64,
        )
        return cls(
            inputs=inputs,
            lookups=tuple(config.lookups),
            numbers=numbers,
            texts=texts,
            number_defaults=defaults,
            request_only=tuple(n for n in kinds if n not in owner),
            on_missing=config.request.on_missing_field,
            kinds=kinds,
            source={
                n: f"lookup {owner[n].name} ({owner[n].layout})" if n in owner else "request"
                for n in kinds
            },
            column=column,
            text_column=text_column,
            lookup_columns={
                lk.name: LookupColumns.of(lk, column, text_column) for lk in config.lookups
            },
        )

    def stored_text(self) -> list[str]:
        """Stored features not read as numbers: the string features, and those no input
        uses (kept as text, so a value nobody reads is never refused)."""
        return [f for lk in self.lookups for f in lk.fields if f not in self.numbers]

    def widths(self) -> dict[str, int]:
        return {i.name: len(i.columns) for i in self.inputs}

    def describe(self) -> list[str]:
        """How each input is fed, a line each, for ``streamfer check``."""
        lines = []
        for i in self.inputs:
            dims = "[batch]" if i.rank == 1 else f"[batch, {len(i.columns)}]"
            fed = ", ".join(f"{c} ({self.source[c]})" for c in i.columns)
            lines.append(f"{i.name} {i.onnx_type}{dims} <- {fed}")
        return lines


_FEEDABLE = (
    "tensor(float)",
    "tensor(double)",
    "tensor(float16)",
    "tensor(int64)",
    "tensor(int32)",
    "tensor(int16)",
    "tensor(int8)",
    "tensor(uint64)",
    "tensor(uint32)",
    "tensor(uint16)",
    "tensor(uint8)",
    "tensor(bool)",
    "tensor(string)",
)


def _columns(
    config: PipelineConfig, model: Sequence[TensorInput], where: str
) -> dict[str, list[str]]:
    """Model input -> its features: as configured, or by default all stored features
    (then the request's array) for a one-input model, or each input by its own name."""
    names = [t.name for t in model]
    configured = config.model.inputs
    if configured is not None:
        missing = [n for n in names if n not in configured]
        unknown = sorted(set(configured) - set(names))
        if missing or unknown:
            raise ModelMismatchError(
                f"{where}: model.inputs does not match the model's inputs "
                f"{[t.describe() for t in model]}: "
                + "; ".join(
                    part
                    for part in (
                        f"missing {missing}" if missing else "",
                        f"not in the model {unknown}" if unknown else "",
                    )
                    if part
                )
            )
        return {n: list(configured[n]) for n in names}
    known = list(dict.fromkeys([*config.stored_fields(), *(config.request.features_array or ())]))
    if len(model) == 1:
        return {names[0]: known}
    if all(n in known for n in names):
        return {n: [n] for n in names}
    raise ModelMismatchError(
        f"{where}: the model has {len(model)} inputs {[t.describe() for t in model]}; "
        "say which features feed each in [pipelines.model.inputs]"
    )


@dataclass(frozen=True, slots=True)
class Assembled:
    """A batch's model inputs and the rows that could not be filled."""

    feeds: Feeds
    rejected: list[Rejected]
    """(row, code, reason) for each request row that must become a dead letter."""
    lookups: int = 0
    """Distinct entities looked up in the store."""
    misses: int = 0
    """Of those, entities the store had nothing for."""


def assemble(plan: FeedPlan, decoded: DecodedRequests, fetcher: BatchFetcher) -> Assembled:
    """Build every model input for the batch's requests with one fetch. Raises
    FeatureStoreError (an outage) or FeatureStoreConfigError; a problem of one entity or
    value is a rejection of its rows."""
    n, inline = len(decoded.rows), decoded.inline
    numbers = np.empty((n, len(plan.numbers)), dtype=np.float64)
    numbers[:] = plan.number_defaults
    texts = np.full((n, len(plan.texts)), "", dtype=object) if plan.texts else None
    rejected: dict[int, tuple[str, str]] = {}
    column, text_column = plan.column, plan.text_column

    no_inline = inline.count(None) == n
    wanted: dict[str, list[str]] = {}
    rows_of: dict[str, list[int]] = {}
    for lookup in plan.lookups:
        entities = decoded.entities[lookup.name]
        fields = plan.lookup_columns[lookup.name].used
        if no_inline:
            rows = [r for r in range(n) if entities[r] is not None]
        else:  # a request that carries every field inline needs no lookup
            width = len(fields)
            rows = [
                r
                for r, (entity, feats) in enumerate(zip(entities, inline, strict=True))
                if entity is not None
                and (feats is None or len(feats) < width or any(f not in feats for f in fields))
            ]
        if rows:
            wanted[lookup.name] = list(dict.fromkeys(entities[r] for r in rows))  # type: ignore[misc]
            rows_of[lookup.name] = rows
    lookups = misses = 0
    if wanted:
        fetched = fetcher.fetch_all(wanted)
        for lookup in plan.lookups:
            if lookup.name not in wanted:
                continue
            got = fetched.get(lookup.name)
            distinct = wanted[lookup.name]
            if got is None or got.values.shape != (len(distinct), len(lookup.fields)):
                shape = None if got is None else got.values.shape
                raise FeatureStoreError(
                    f"feature store answered {shape} for lookup {lookup.name!r}: "
                    f"{len(distinct)} entities of {len(lookup.fields)} values expected"
                )
            found, unknown = _fill(
                lookup, plan.lookup_columns[lookup.name], got, distinct, rows_of[lookup.name],
                decoded, numbers, texts, rejected,
            )  # fmt: skip
            lookups += found
            misses += unknown

    if not no_inline:
        _overlay(inline, numbers, column, texts, text_column)
    if plan.request_only and plan.on_missing == "dead_letter":
        need = plan.request_only
        for r in range(n):
            feats = inline[r] or {}
            missing = [f for f in need if f not in feats]
            if missing and r not in rejected:
                rejected[r] = ("missing_feature", f"request lacks features {missing[:5]}")

    feeds: Feeds = {}
    for spec in plan.inputs:
        feeds[spec.name] = _convert(spec, numbers, texts, rejected)
    return Assembled(
        feeds, [(r, code, why) for r, (code, why) in sorted(rejected.items())], lookups, misses
    )


def _fill(
    lookup: LookupSpec,
    at: LookupColumns,
    got: Fetched,
    distinct: list[str],
    lookup_rows: list[int],
    decoded: DecodedRequests,
    numbers: npt.NDArray[np.float64],
    texts: npt.NDArray[np.object_] | None,
    rejected: dict[int, tuple[str, str]],
) -> tuple[int, int]:
    """Write one lookup's stored values into the batch's matrices; reject the rows its
    policy refuses. Returns (entities looked up, entities unknown)."""
    entities, inline = decoded.entities[lookup.name], decoded.inline
    values, absent, bad = got.values, got.absent, got.bad
    complete = not absent.any()  # every entity had every field: the common batch
    position = {entity: i for i, entity in enumerate(distinct)}
    idx = np.fromiter((position[entities[r]] for r in lookup_rows), np.intp, len(lookup_rows))  # type: ignore[index]
    rows = np.asarray(lookup_rows, dtype=np.intp)
    if at.every_number:
        if complete:
            filled = values
        else:
            with np.errstate(invalid="ignore"):
                filled = np.where(absent, lookup.default_value, values)
        numbers[rows] = filled[idx]
    elif len(at.number_src):
        src = at.number_src
        with np.errstate(invalid="ignore"):
            filled = np.where(absent[:, src], lookup.default_value, values[:, src])
        numbers[np.ix_(rows, at.number_dst)] = filled[idx]
    if len(at.text_src) and texts is not None:
        if got.text is None:
            raise FeatureStoreError(f"lookup {lookup.name!r} answered no text for string features")
        src = at.text_src
        stored = got.text[:, src]
        stored = np.where(absent[:, src], "", stored)
        texts[np.ix_(rows, at.text_dst)] = stored[idx]

    if complete and bad.count(None) == len(bad):
        return len(distinct), 0
    unknown: npt.NDArray[np.bool_] = np.asarray(absent.all(axis=1))
    partial: npt.NDArray[np.bool_] = np.asarray(absent.any(axis=1)) & ~unknown
    troubled = np.fromiter((b is not None for b in bad), np.bool_, len(bad))
    if lookup.on_missing_entity == "dead_letter":
        troubled |= unknown
    if lookup.on_missing_field == "dead_letter":
        troubled |= partial
    if troubled.any():
        for j in np.flatnonzero(troubled[idx]).tolist():
            r = lookup_rows[j]
            e = int(idx[j])
            if r in rejected:
                continue
            problem = bad[e]
            if problem is not None:
                rejected[r] = problem
                continue
            given = inline[r] or {}
            missing = [
                f
                for k, f in enumerate(lookup.fields)
                if absent[e, k] and f not in given and f in at.used
            ]
            if not missing:
                continue  # the request carried what the store lacks
            if unknown[e]:
                what = (
                    f"entity {entities[r]!r}"
                    if len(decoded.entities) == 1
                    else (f"{lookup.name} {entities[r]!r}")
                )
                rejected[r] = ("unknown_entity", f"no features for {what}")
            else:
                rejected[r] = (
                    "missing_feature",
                    f"{lookup.name} {entities[r]!r} lacks fields {missing}",
                )
    return len(distinct), int(unknown.sum())


def _overlay(
    inline: list[dict[str, Any] | None],
    numbers: npt.NDArray[np.float64],
    column: dict[str, int],
    texts: npt.NDArray[np.object_] | None,
    text_column: dict[str, int],
) -> None:
    """Inline values over stored ones, by feature name."""
    width = len(column)
    order = list(column)
    for r, feats in enumerate(inline):
        if not feats:
            continue
        if texts is None and len(feats) == width and all(f in feats for f in order):
            numbers[r] = [feats[f] for f in order]  # every number inline: one row write
            continue
        for name, v in feats.items():
            j = column.get(name)
            if j is not None:
                numbers[r, j] = v
            elif texts is not None and (k := text_column.get(name)) is not None:
                texts[r, k] = v


def _convert(
    spec: InputFeed,
    numbers: npt.NDArray[np.float64],
    texts: npt.NDArray[np.object_] | None,
    rejected: dict[int, tuple[str, str]],
) -> npt.NDArray[Any]:
    """One input's columns in its dtype; rows whose values do not fit are rejected."""
    cols = list(spec.matrix)
    if spec.kind == "text":
        assert texts is not None
        out = texts[:, cols]
        return out[:, 0] if spec.rank == 1 else out
    whole = len(cols) == numbers.shape[1] and cols == list(range(len(cols)))
    x = numbers if whole else numbers[:, cols]
    dtype = spec.dtype
    if dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            out = x.astype(dtype)
        fine = np.isfinite(out)
        if not fine.all():
            _reject(spec, ~fine, x, rejected, "non_finite", f"is NaN or infinite as {dtype}")
    elif dtype.kind == "b":
        fine = (x == 0) | (x == 1)
        if not fine.all():
            _reject(spec, ~fine, x, rejected, "bad_feature_value", "is not a boolean (0 or 1)")
        out = x != 0
    else:
        info = np.iinfo(dtype)
        # The bounds as doubles: int64's largest value is 2**63 as a double, which would
        # pass ``x <= max`` and overflow the cast; one past it is exact for every dtype.
        low, past = float(info.min), float(info.max) + 1.0
        with np.errstate(invalid="ignore"):
            fine = (x == np.floor(x)) & (x >= low) & (x < past)
        if not fine.all():
            _reject(
                spec, ~fine, x, rejected, "bad_feature_value",
                f"is not a whole number from {info.min} to {info.max} ({dtype})",
            )  # fmt: skip
            x = np.where(fine, x, 0)
        out = x.astype(dtype)
    return out[:, 0] if spec.rank == 1 else out


def _reject(
    spec: InputFeed,
    wrong: npt.NDArray[np.bool_],
    values: npt.NDArray[np.float64],
    rejected: dict[int, tuple[str, str]],
    code: str,
    what: str,
) -> None:
    for r in np.flatnonzero(wrong.any(axis=1)).tolist():
        if r in rejected:
            continue
        j = int(np.flatnonzero(wrong[r])[0])
        rejected[r] = (
            code,
            f"feature {spec.columns[j]!r} = {values[r, j].item()!r} of input {spec.name!r} {what}",
        )

"""Whether a model can stand in for a pipeline's model: a new version of it, a canary or
a shadow.

A stand-in runs on arrays assembled for the pipeline's model (a batch enriched before a
reload, the canary's share of a batch, the shadow's copy of it), so it must be fed
exactly the same way: the same inputs, each of the same type, filled by the same
features in the same columns. A new version and a canary publish into the same result
stream, so they must also give the same result fields, each with the same shape per row
and the same kind of value (number, integer, bool or string). ``ModelFit`` holds what is
compared, so the reloader keeps it rather than the engine it came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.errors import ModelMismatchError
from worker.models.parts import LoadedModel
from worker.pipeline import InputFeed

__all__ = ["ModelFit"]

_KINDS = {"f": "number", "i": "integer", "u": "integer", "b": "bool", "O": "string", "U": "string"}


@dataclass(frozen=True, slots=True)
class ModelFit:
    inputs: tuple[InputFeed, ...]
    numbers: tuple[str, ...]
    texts: tuple[str, ...]
    results: tuple[tuple[str, tuple[int, ...], str], ...]
    """(field, shape of one row, kind), by field name."""

    @classmethod
    def of(cls, loaded: LoadedModel) -> ModelFit:
        """Runs the model once on one warm-up row, to see its results' shapes."""
        engine, plan = loaded
        outputs = engine.infer(engine.example(plan.widths())(1))
        results = tuple(
            (name, tuple(values.shape[1:]), _KINDS.get(values.dtype.kind, values.dtype.str))
            for name, values in sorted(outputs.items())
        )
        return cls(plan.inputs, plan.numbers, plan.texts, results)

    def check(self, new: ModelFit, whose: str, *, results: bool = True) -> None:
        """Raise ModelMismatchError saying how ``new`` differs from this model (``whose``:
        "the live model's") in its feeds, and with ``results`` in its result fields."""
        if (new.inputs, new.numbers, new.texts) != (self.inputs, self.numbers, self.texts):
            raise ModelMismatchError(
                f"its inputs are not fed like {whose}: {_describe(new.inputs)}; {whose} are "
                f"{_describe(self.inputs)}"
            )
        if results and new.results != self.results:
            raise ModelMismatchError(
                f"its results would be {_fields(new)}; {whose} are {_fields(self)}"
            )


def _describe(inputs: tuple[InputFeed, ...]) -> list[str]:
    return [
        f"{i.name} {i.onnx_type}[batch{'' if i.rank == 1 else f', {len(i.columns)}'}] "
        f"<- {', '.join(i.columns)}"
        for i in inputs
    ]


def _fields(fit: ModelFit) -> str:
    return ", ".join(
        f"{name} ({kind}{list(shape) if shape else ''})" for name, shape, kind in fit.results
    )

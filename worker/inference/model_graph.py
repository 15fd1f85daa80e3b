"""Several models run as one engine: ``ModelGraph``, the steps of a pipeline's graph on
the whole batch, in order, one call each.

A pipeline serves a graph as it serves one model (the same slot, bisection, model-fault
hold and output cache), so the graph is an engine: its inputs are every step's
feature-fed inputs, named ``step.input``; a step's inputs taken from earlier outputs are
those arrays, reshaped or cast once per batch (never per row); its outputs are the last
step's and those the config publishes. An error of a step's model is re-raised naming
the step, so the rows it refuses are dead-lettered with that name, never reach a later
step, and a model fault (``/readyz``) says which step is at fault. ``check`` runs one
row through the steps and raises ``ModelMismatchError`` where an output does not fit
the input it feeds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.errors import EngineError, InferenceServerError, ModelMismatchError
from worker.inference.engine import Example, Feeds, Outputs, ServingEngine, TensorInput

__all__ = ["GraphStep", "ModelGraph"]


@dataclass(frozen=True, slots=True)
class GraphStep:
    """One step: its engine, which of its inputs the graph's feeds fill and which an
    earlier step's output (model input -> ``(step, output)`` as the config names it)."""

    name: str
    engine: ServingEngine
    version: str
    fed: tuple[str, ...]
    """Inputs filled from features, fed as ``step.input``."""
    wired: dict[str, tuple[str, str]] = field(default_factory=dict)


class ModelGraph:
    """The steps of a graph as one ``ServingEngine``; ``infer`` runs them in order."""

    def __init__(self, steps: Sequence[GraphStep], publish: Mapping[str, tuple[str, str]]):
        self._steps = tuple(steps)
        fields = {step.name: _fields(step.engine) for step in self._steps}
        self._wired = {
            step.name: {
                name: (src, _field(fields, src, out, f"steps.{step.name}.inputs.{name}"))
                for name, (src, out) in step.wired.items()
            }
            for step in self._steps
        }
        self._publish = {
            result: (src, _field(fields, src, out, f"steps.{src}.publish.{result}"))
            for result, (src, out) in publish.items()
        }
        last = self._steps[-1]
        names = {step.name: step.engine.outputs for step in self._steps}
        self._outputs = {f: f"{last.name}.{onnx}" for f, onnx in names[last.name].items()}
        self._outputs.update({r: f"{s}.{names[s][o]}" for r, (s, o) in self._publish.items()})
        self._inputs = [
            replace(i, name=f"{step.name}.{i.name}")
            for step in self._steps
            for i in step.engine.inputs
            if i.name in step.fed
        ]
        self._own_inputs = {
            step.name: {i.name: i for i in step.engine.inputs} for step in self._steps
        }
        self.served_version = "+".join(step.version for step in self._steps)
        self.provider = last.engine.provider
        self.providers = list(last.engine.providers)
        self.requested = list(last.engine.requested)
        self.output_types = {
            f"{step.name}.{out}": kind
            for step in self._steps
            for out, kind in step.engine.output_types.items()
        }
        joined = "".join(step.engine.model_hash for step in self._steps)
        self._hash = hashlib.sha256(joined.encode()).hexdigest()

    @property
    def steps(self) -> tuple[GraphStep, ...]:
        return self._steps

    @property
    def inputs(self) -> list[TensorInput]:
        return list(self._inputs)

    @property
    def outputs(self) -> dict[str, str]:
        """Result field -> ``step.output``, the output as its model names it (the key of
        ``output_types``)."""
        return dict(self._outputs)

    @property
    def model_hash(self) -> str:
        """SHA-256 of the steps' digests, in order: a new version of any step changes it."""
        return self._hash

    def infer(self, feeds: Feeds) -> Outputs:
        """Each step once on the whole batch, in order; an error names the step."""
        produced: dict[str, Outputs] = {}
        for step in self._steps:
            own = {name: feeds[f"{step.name}.{name}"] for name in step.fed}
            wants = self._own_inputs[step.name]
            for name, (src, out) in self._wired[step.name].items():
                own[name] = _as_input(produced[src][out], wants[name])
            try:
                produced[step.name] = step.engine.infer(own)
            except EngineError as exc:
                raise EngineError(f"step {step.name}: {exc}") from exc
            except InferenceServerError as exc:  # an outage: the batch waits, named
                raise InferenceServerError(f"step {step.name}: {exc}") from exc
        last = produced[self._steps[-1].name]
        outputs = dict(last)
        for result, (src, out) in self._publish.items():
            outputs[result] = produced[src][out]
        return outputs

    def check(self) -> None:
        """Run one example row through the steps; raise ModelMismatchError naming the
        step, input and output where an output cannot feed its input (dtype or shape)."""
        example = self.example()(1)
        produced: dict[str, Outputs] = {}
        for step in self._steps:
            own = {name: example[f"{step.name}.{name}"] for name in step.fed}
            for name, (src, out) in self._wired[step.name].items():
                want = self._own_inputs[step.name][name]
                got = produced[src][out]
                problem = _misfit(got, want)
                if problem is not None:
                    raise ModelMismatchError(
                        f"steps.{step.name}.inputs.{name}: {src}.{out} is "
                        f"{got.dtype}{list(got.shape[1:])} per batch row, but input "
                        f"{want.describe()} {problem}"
                    )
                own[name] = _as_input(got, want)
            produced[step.name] = step.engine.infer(own)

    def example(self, widths: Mapping[str, int] | None = None) -> Example:
        """Zeros for every feature-fed input of every step."""
        given = widths or {}
        makers = []
        for step in self._steps:
            prefix = f"{step.name}."
            own = {k.removeprefix(prefix): w for k, w in given.items() if k.startswith(prefix)}
            makers.append((prefix, step.fed, step.engine.example(own)))

        def feeds(n: int) -> Feeds:
            out: dict[str, npt.NDArray[Any]] = {}
            for prefix, fed, make in makers:
                made = make(n)
                out.update({prefix + name: made[name] for name in fed})
            return out

        return feeds

    def warm_up(self, batch_sizes: Iterable[int], example: Example | None = None) -> None:
        """Warm every step at each size; each step proves its own outputs publishable."""
        make = example or self.example()
        for size in batch_sizes:
            self.infer(make(size))


def _fields(engine: ServingEngine) -> dict[str, str]:
    """Every name a reference may use for an engine's output -> its result field: the
    field itself, and the model's own output name."""
    names = {onnx: result for result, onnx in engine.outputs.items()}
    names.update({result: result for result in engine.outputs})
    return names


def _field(fields: Mapping[str, Mapping[str, str]], step: str, out: str, where: str) -> str:
    names = fields[step]
    if out not in names:
        raise ModelMismatchError(
            f"{where}: step {step} has no output {out!r} (its outputs: {', '.join(names)})"
        )
    return names[out]


def _misfit(got: npt.NDArray[Any], want: TensorInput) -> str | None:
    """Why ``got`` (one row per batch row) cannot feed ``want``; None when it can."""
    if want.dtype is None or not np.can_cast(got.dtype, want.dtype, "same_kind"):
        return "takes another type"
    row = got.shape[1:]
    width = int(np.prod(row)) if row else 1
    if want.rank == 1 and width != 1:
        return "takes one value per row"
    if want.rank == 2 and len(row) > 1:
        return "takes one vector per row"
    if want.rank == 2 and want.width is not None and width != want.width:
        return f"takes {want.width} columns"
    return None


def _as_input(values: npt.NDArray[Any], want: TensorInput) -> npt.NDArray[Any]:
    """An earlier output as ``want`` takes it: its shape and dtype, one numpy call each."""
    n = len(values)
    shaped = values.reshape(n) if want.rank == 1 else values.reshape(n, -1)
    return shaped if want.dtype is None else shaped.astype(want.dtype, copy=False)

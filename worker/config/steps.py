"""A model graph: a pipeline's models as named steps (``[[pipelines.steps]]``), each fed
from features, request fields or earlier steps' outputs, run on the whole batch in order.

The rules that need no model are checked here, when the config loads: step names unique,
every reference ``"step.output"`` naming an earlier step (a later one or the step itself
would be a cycle), result fields published once. What needs the models (an output that
exists, its dtype and shape against the input it feeds) is checked when they load
(``worker.models.graph``). ``graph_model`` is the ``ModelSpec`` the rest of the pipeline
sees for the graph: its feature-fed inputs under ``step.input``, named after its steps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import Field, model_validator

from worker.config.base import Frozen
from worker.config.model_spec import ModelSpec

__all__ = ["StepSpec", "check_steps", "graph_model", "step_reference"]

_REFERENCE = re.compile(r"^([A-Za-z0-9_-]+)\.([^\s]+)$")
"""``step.output``: a step's name (no dots) and one of its outputs."""


class StepSpec(Frozen):
    """One model of a graph: its name, its model (as ``[pipelines.model]``), and where
    each of the model's inputs comes from."""

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="The step's name, in references (step.output), dead letters and /readyz.",
    )
    model: ModelSpec = Field(
        description="The step's model, an ONNX file or a Triton model, as [pipelines.model]."
    )
    inputs: dict[str, list[str] | str] = Field(
        min_length=1,
        description=(
            "Model input -> the features (stored or request fields) that fill its "
            'columns, in order, or "step.output", an earlier step\'s output.'
        ),
    )
    publish: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Result field -> an output of this step, also published (an earlier step's);"
            " the last step's outputs are published as its model.outputs says."
        ),
    )

    @model_validator(mode="after")
    def _inputs_are_sound(self) -> StepSpec:
        if self.model.inputs is not None:
            raise ValueError(
                f"step {self.name}: give its inputs in the step's inputs table, not in model.inputs"
            )
        for name, source in self.inputs.items():
            if isinstance(source, str):
                if step_reference(source) is None:
                    raise ValueError(
                        f"step {self.name}: inputs.{name} = {source!r} is not 'step.output' "
                        "(a list names features)"
                    )
            elif not source or len(set(source)) != len(source):
                raise ValueError(f"step {self.name}: inputs.{name} must list features, each once")
        return self


def step_reference(source: str) -> tuple[str, str] | None:
    """``(step, output)`` of a reference ``"step.output"``; None for anything else."""
    found = _REFERENCE.fullmatch(source)
    return (found.group(1), found.group(2)) if found else None


def check_steps(steps: Sequence[StepSpec]) -> None:
    """Raise ValueError naming a repeated step, a reference to an unknown, later or the
    same step (a cycle), a result field published twice, or a table only the last step
    may have."""
    names = [step.name for step in steps]
    seen: set[str] = set()
    fields: dict[str, str] = {}
    for i, step in enumerate(steps):
        if step.name in seen:
            raise ValueError(f"steps: {step.name!r} is named twice")
        for name, source in step.inputs.items():
            if not isinstance(source, str):
                continue
            ref = step_reference(source)
            assert ref is not None
            if ref[0] not in names:
                raise ValueError(
                    f"steps.{step.name}.inputs.{name}: {source!r} names no step (steps: "
                    f"{', '.join(names)})"
                )
            if ref[0] not in seen:
                raise ValueError(
                    f"steps.{step.name}.inputs.{name}: {source!r} is not an earlier step's "
                    "output: steps run in order, so a step reads only the ones before it "
                    "(a graph has no cycles)"
                )
        last = i == len(steps) - 1
        if not last and (step.model.outputs is not None or step.model.class_names is not None):
            raise ValueError(
                f"steps.{step.name}: model.outputs and class_names are for the last step; "
                "publish an earlier step's outputs with its publish table"
            )
        for result in step.publish:
            if result in fields:
                raise ValueError(
                    f"steps.{step.name}.publish.{result}: also published by {fields[result]}"
                )
            fields[result] = step.name
        seen.add(step.name)


def graph_model(steps: Sequence[StepSpec]) -> ModelSpec:
    """The ``ModelSpec`` a pipeline of ``steps`` serves as one model: named after its
    steps' models, its inputs the feature-fed inputs of every step as ``step.input``.
    It is never loaded itself (``worker.models.graph`` loads the steps) nor watched."""
    last = steps[-1].model
    inputs = {
        f"{step.name}.{name}": list(source)
        for step in steps
        for name, source in step.inputs.items()
        if not isinstance(source, str)
    }
    return last.model_copy(
        update={
            "name": "+".join(step.model.name for step in steps),
            "version": "+".join(step.model.version for step in steps),
            "inputs": inputs,
            "outputs": None,
            "class_names": None,
            "sha256": None,
            "watch": False,
            "version_dir": None,
            "deterministic": all(step.model.deterministic for step in steps),
        }
    )

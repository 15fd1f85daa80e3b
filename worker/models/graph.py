"""A pipeline's steps opened as one engine: ``open_graph``.

Each step's model opens as ``[pipelines.model]`` would (an ONNX file or a Triton model,
its calls counted under the pipeline), and the graph is checked before it serves: every
input of every step's model fed, by an input it has, and each earlier output it reads
of a type and shape that input takes (``ModelGraph.check``). A mismatch is a
``ModelMismatchError`` naming the step, so the worker exits 2 at start-up and ``check``
says what to fix. ``step_candidates`` is what the reloader looks at for a graph: each
step's newest file (``worker.models.sources``), as for a single model, and
``served_steps`` the version each step on a Triton server follows.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.config import ModelSpec, PipelineConfig, StepSpec, graph_model, step_reference
from worker.errors import EngineError, InferenceServerError, ModelMismatchError
from worker.inference import GraphStep, ModelGraph, ServingEngine, TritonEngine
from worker.models.sources import Fingerprint, fingerprint, newest

__all__ = ["StepFiles", "open_graph", "served_steps", "step_candidates"]


def open_graph(
    config: PipelineConfig, open_engine: Callable[[ModelSpec], ServingEngine]
) -> ModelGraph:
    """The engines of ``config.steps``, each opened by ``open_engine``, as one
    ``ModelGraph``, checked."""
    steps = []
    publish: dict[str, tuple[str, str]] = {}
    for spec in config.steps or ():
        engine = open_engine(spec.model)
        steps.append(_step(spec, engine))
        publish.update({result: (spec.name, out) for result, out in spec.publish.items()})
    graph = ModelGraph(steps, publish)
    graph.check()
    return graph


def _step(spec: StepSpec, engine: ServingEngine) -> GraphStep:
    """``spec`` on ``engine``; raises ModelMismatchError for an input fed by nothing or
    one the model does not have."""
    has = [i.name for i in engine.inputs]
    unknown = sorted(set(spec.inputs) - set(has))
    if unknown:
        raise ModelMismatchError(
            f"steps.{spec.name}.inputs: model {spec.model.where} has no input "
            f"{', '.join(unknown)} (its inputs: {', '.join(has)})"
        )
    missing = [name for name in has if name not in spec.inputs]
    if missing:
        raise ModelMismatchError(
            f"steps.{spec.name}: input {', '.join(missing)} of model {spec.model.where} is "
            "fed by nothing; name its features or an earlier step's output in the step's inputs"
        )
    wired = {}
    for name, source in spec.inputs.items():
        if isinstance(source, str):
            ref = step_reference(source)
            assert ref is not None  # the config's validation made sure
            wired[name] = ref
    version = getattr(engine, "served_version", None) or spec.model.version
    fed = tuple(name for name in has if name not in wired)
    return GraphStep(spec.name, engine, str(version), fed, wired)


StepFiles = tuple[Fingerprint | str | None, ...]
"""Each step's newest file as ``stat`` sees it; for a step on a Triton server, the
version it follows (``served_steps``), None before it is known."""


def step_candidates(config: PipelineConfig) -> tuple[PipelineConfig, StepFiles] | None:
    """``config`` with each step's model at its newest file now (``newest``), and what
    those files are; None while one has none."""
    steps: list[StepSpec] = []
    files: list[Fingerprint | None] = []
    for step in config.steps or ():
        spec = step.model
        if spec.triton is not None:
            steps.append(step)
            files.append(None)
            continue
        source = newest(spec)
        found = fingerprint(*source) if source is not None else None
        if found is None:
            return None
        files.append(found)
        model = spec.model_copy(update={"path": found.path, "version": found.version})
        steps.append(step.model_copy(update={"model": model}))
    update = {"steps": steps, "model": graph_model(steps)}
    return config.model_copy(update=update), tuple(files)


def served_steps(files: StepFiles, engine: object, *, ask: bool) -> StepFiles:
    """``files`` with each step of the live graph ``engine`` that runs on a Triton server
    as the version it follows: with ``ask``, the highest its server has ready (unless
    the step pins one); else, or while the server cannot answer (the batches wait for
    it on their own), the version the step serves now."""
    if not isinstance(engine, ModelGraph) or len(engine.steps) != len(files):
        return files
    out = list(files)
    for i, step in enumerate(engine.steps):
        server = step.engine
        if out[i] is not None or not isinstance(server, TritonEngine):
            continue
        version = None
        if ask and server.settings.version is None:
            try:
                version = server.latest_version()
            except (InferenceServerError, EngineError):
                version = None
        out[i] = version or step.version
    return tuple(out)

"""Running a model: the ONNX Runtime engine, execution providers, device I/O, batch-size
buckets, what the graph declares, the model slot a pipeline serves from, and outputs as
rows; or a Triton Inference Server that runs it (``triton``, which imports its client
only when an engine is made)."""

from __future__ import annotations

from worker.inference.engine import (
    ONNX_DTYPES,
    Feeds,
    InferenceEngine,
    OnnxEngine,
    Outputs,
    ServingEngine,
    TensorInput,
    file_sha256,
    warm_up_sizes,
)
from worker.inference.model_graph import GraphStep, ModelGraph
from worker.inference.providers import input_shapes, provider_options, why_not_serving
from worker.inference.rows import finite_rows, row_outputs
from worker.inference.slot import LiveModel, ModelIdentity, ModelSlot
from worker.inference.triton import TRITON_PROVIDER, TritonEngine

__all__ = [
    "ONNX_DTYPES",
    "TRITON_PROVIDER",
    "Feeds",
    "GraphStep",
    "InferenceEngine",
    "LiveModel",
    "ModelGraph",
    "ModelIdentity",
    "ModelSlot",
    "OnnxEngine",
    "Outputs",
    "ServingEngine",
    "TensorInput",
    "TritonEngine",
    "file_sha256",
    "finite_rows",
    "input_shapes",
    "provider_options",
    "row_outputs",
    "warm_up_sizes",
    "why_not_serving",
]

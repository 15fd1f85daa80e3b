"""ONNX models that misbehave on purpose, built with onnx.helper for the fault harness.

``make_slow_model`` is a deep MLP (one layer run in a loop) whose batch takes longer
than a chosen time, to prove that a model slower than ``max.poll.interval.ms`` does not
cost the worker its group membership. ``make_poison_model`` fails (ONNX Runtime raises
an out-of-bounds Gather) on any row whose first feature is 1000 or more, to prove that
one poison row does not stop the rest of its batch.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["make_poison_model", "make_slow_model"]

_OPSET = [helper.make_opsetid("", 17)]


def make_poison_model(path: Path, n_features: int = 30) -> Path:
    """score = table[int(x0)] + sum(x); raises for x0 outside [0, 1000)."""
    table = numpy_helper.from_array(np.linspace(0, 1, 1000, dtype=np.float32), "table")
    starts = numpy_helper.from_array(np.array([0], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([1], np.int64), "ends")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["x0"]),
        helper.make_node("Cast", ["x0"], ["idx"], to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "idx"], ["looked_up"]),
        helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1),
        helper.make_node("Add", ["looked_up", "total"], ["score"]),
    ]
    graph = helper.make_graph(
        nodes,
        "poison",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", n_features])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n", 1])],
        [table, starts, ends, axes],
    )
    return _save(helper.make_model(graph, opset_imports=_OPSET), path)


def make_slow_model(
    path: Path, *, seconds_per_batch: float, batch_size: int, n_features: int = 30
) -> Path:
    """A deep MLP calibrated here so one batch of ``batch_size`` rows takes about 1.3 x
    ``seconds_per_batch`` on one thread (measured per layer, then sized).

    Wide layers, so that few rounds are needed: at width 512 a layer took 0.05 ms; at
    4096 an 11.7 s batch is about 1,000 rounds of one shared 64 MB weight."""
    width = 4096
    probe_layers = 8
    per_layer = _time_batch(_mlp(probe_layers, width, n_features), batch_size) / probe_layers
    layers = max(1, int(1.3 * seconds_per_batch / max(per_layer, 1e-6)) + 1)
    model = _mlp(layers, width, n_features)
    return _save(model, path)


def _time_batch(model: onnx.ModelProto, batch_size: int) -> float:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), opts)
    batch = np.ones(
        (batch_size, int(model.graph.input[0].type.tensor_type.shape.dim[1].dim_value)),
        dtype=np.float32,
    )
    session.run(None, {"x": batch})
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        session.run(None, {"x": batch})
        best = min(best, time.perf_counter() - started)
    return best


def _mlp(layers: int, width: int, n_features: int) -> onnx.ModelProto:
    """``layers`` rounds of ``h = tanh(h @ w)`` as one ONNX ``Loop``: as slow to run as
    that many layers, but one node to load (ONNX Runtime took minutes to load a thousand
    unrolled layers)."""
    rng = np.random.default_rng(0)
    w_in = numpy_helper.from_array(
        (rng.standard_normal((n_features, width)) / np.sqrt(n_features)).astype(np.float32), "w_in"
    )
    w = numpy_helper.from_array(
        (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), "w"
    )
    trips = numpy_helper.from_array(np.array(layers, np.int64), "trips")
    keep_going = numpy_helper.from_array(np.array(True), "keep_going")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["h_in", "w"], ["m"]),
            helper.make_node("Tanh", ["m"], ["h_out"]),
        ],
        "layer",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, ["n", width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, ["n", width]),
        ],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h0"]),
        helper.make_node("Loop", ["trips", "keep_going", "h0"], ["h"], body=body),
        helper.make_node("ReduceMean", ["h"], ["score"], axes=[1], keepdims=1),
    ]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", n_features])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n", 1])],
        [w_in, w, trips, keep_going],
    )
    return helper.make_model(graph, opset_imports=_OPSET)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path

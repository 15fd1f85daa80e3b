"""One ONNX Runtime session configured as streamfer configures its own.

Every contender that runs the model itself (the naive loop, the faust agent, the
ONNX-Runtime-alone ceiling) loads it here: CPU execution provider, one intra-op and one
inter-op thread, the ``[pipelines.model]`` defaults of a streamfer worker, so the model
costs every contender the same and only the loop around it differs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_session"]


def load_session(path: str, intra_op_threads: int = 1) -> tuple[Any, str]:
    """The session and the name of its one input."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session, session.get_inputs()[0].name

"""A Triton Inference Server serving ONNX files, for the tests and benchmarks.

Run by ``streamfer_dev.triton`` under the interpreter of the server's own venv (Debian's
Python with its shared libpython, which the Python backend's stub embeds), never
imported by the worker: it imports PyTriton, which binds a Python function to a model
name and version and starts the ``tritonserver`` binary bundled in its wheel. Each
model is an ONNX file run by ONNX Runtime inside that function, with dynamic batching,
on the CPU; its tensor inputs and outputs are declared from the file. An output the file
gives as one value a row (``[batch]``) is declared as Triton's ONNX Runtime backend
declares it: ``dims: [1]`` with ``reshape: { shape: [] }`` (PyTriton has no reshape of
its own, so its config generator is wrapped to add it).

``--instances N`` gives each model N instances (one bound function and ONNX Runtime
session each), so calls in flight are served side by side.

``--refuse-above X`` makes every model refuse a request holding a number above X (the
server answers it with an error, as a model that rejects its input does), so the tests
can see the worker's per-row path against a real server. It stops on SIGTERM.

    python triton_serve.py --grpc-port 8001 --http-port 8000 --metrics-port 8002 \\
        --model fraud:1:/models/v1.onnx --model fraud:2:/models/v2.onnx
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.model_config.generator import ModelConfigGenerator
from pytriton.triton import Triton, TritonConfig

_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(string)": bytes,
}


def _tensors(declared: list[Any]) -> list[Tensor]:
    return [
        Tensor(
            name=d.name,
            dtype=_TYPES[d.type],
            shape=tuple(s if isinstance(s, int) else -1 for s in d.shape[1:]) or (1,),
        )
        for d in declared
        if d.type in _TYPES
    ]


_PER_ROW: set[str] = set()
"""Names of the outputs an ONNX file gives as ``[batch]``."""
_generate = ModelConfigGenerator.get_config


def _with_reshape(self: ModelConfigGenerator) -> dict[str, Any]:
    config: dict[str, Any] = _generate(self)
    for output in config.get("output", []):
        if output["name"] in _PER_ROW and output["dims"] == [1]:
            output["reshape"] = {"shape": []}
    return config


ModelConfigGenerator.get_config = _with_reshape


def _serving(path: str, refuse_above: float | None) -> tuple[Any, list[Tensor], list[Tensor]]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    inputs, outputs = _tensors(session.get_inputs()), _tensors(session.get_outputs())
    names = [t.name for t in outputs]
    _PER_ROW.update(d.name for d in session.get_outputs() if len(d.shape) == 1)
    ranks = {d.name: len(d.shape) for d in session.get_inputs()}

    @batch  # type: ignore[untyped-decorator]
    def infer(**feeds: np.ndarray) -> dict[str, np.ndarray]:
        if refuse_above is not None:
            for name, values in feeds.items():
                if values.dtype.kind == "f" and (values > refuse_above).any():
                    raise ValueError(f"input {name} holds a value above {refuse_above}")
        # a rank-1 ONNX input arrives as [batch, 1] (Triton has no scalar rows)
        fed = {k: v.reshape(-1) if ranks[k] == 1 else v for k, v in feeds.items()}
        out = session.run(names, fed)
        # and a rank-1 output leaves as [batch, 1], the shape declared for it
        return {n: v.reshape(-1, 1) if v.ndim == 1 else v for n, v in zip(names, out, strict=True)}

    return infer, inputs, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, required=True, help="gRPC port")
    parser.add_argument("--http-port", type=int, required=True, help="HTTP port")
    parser.add_argument("--metrics-port", type=int, required=True, help="metrics port")
    parser.add_argument(
        "--model", action="append", required=True, help="NAME:VERSION:PATH of an ONNX file"
    )
    parser.add_argument("--max-batch-size", type=int, default=256, help="the models' largest batch")
    parser.add_argument("--refuse-above", type=float, default=None, help="refuse numbers above")
    parser.add_argument("--instances", type=int, default=1, help="instances of each model")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    config = TritonConfig(
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
    )
    with Triton(config=config) as triton:
        for spec in args.model:
            name, version, path = spec.split(":", 2)
            served = [_serving(path, args.refuse_above) for _ in range(args.instances)]
            _infer, inputs, outputs = served[0]
            triton.bind(
                model_name=name,
                model_version=int(version),
                infer_func=[infer for infer, _i, _o in served],
                inputs=inputs,
                outputs=outputs,
                config=ModelConfig(
                    max_batch_size=args.max_batch_size,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=100),
                ),
            )
        triton.run()
        print("serving", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()

"""A fake Triton server for ``TritonEngine``'s unit tests: what ``tritonclient.grpc``
hands the engine (its client, ``InferInput``, ``InferRequestedOutput``), answering like
a server with one model that sums its input's columns (``x`` FP32 [-1, width] ->
``score`` FP32 [-1, 1]), dynamic batching up to ``max_batch_size`` rows."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt


class TritonFailure(Exception):
    """As ``tritonclient.utils.InferenceServerException``: a gRPC status and a message."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(message)
        self._code, self._message = code, message

    def status(self) -> str | None:
        return None if self._code is None else f"StatusCode.{self._code}"

    def message(self) -> str:
        return self._message


@dataclass
class _Tensor:
    name: str
    datatype: str
    shape: list[int]


@dataclass
class _Described:
    """Metadata or config, as the client's protobuf messages carry them."""

    fields: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        return self.fields[name]

    def SerializeToString(self, deterministic: bool = False) -> bytes:
        return repr(sorted(self.fields.items())).encode()


@dataclass
class _OutputConfig:
    """An output of the model's config: ``dims`` and an optional ``reshape``."""

    name: str
    dims: list[int]
    reshape_shape: list[int] | None = None

    @property
    def reshape(self) -> Any:
        return SimpleNamespace(shape=self.reshape_shape or [])

    def HasField(self, name: str) -> bool:
        return name == "reshape" and self.reshape_shape is not None


class _Input:
    def __init__(self, name: str, shape: list[int], datatype: str) -> None:
        self.name, self.shape, self.datatype = name, shape, datatype
        self.data: npt.NDArray[Any] | None = None

    def set_data_from_numpy(self, data: npt.NDArray[Any]) -> None:
        self.data = data


class _Output:
    def __init__(self, name: str) -> None:
        self.name = name


@dataclass
class FakeTriton:
    versions: list[str] = field(default_factory=lambda: ["1", "2"])
    ready: set[str] = field(default_factory=lambda: {"1", "2"})
    width: int = 3
    max_batch_size: int = 4
    failures: list[TritonFailure] = field(default_factory=list)
    """Raised by the next calls, one each."""
    per_row_score: bool = False
    """Declare ``score`` as Triton's ONNX backend declares a ``[batch]`` output: dims
    ``[1]``, reshaped to ``[]``."""
    workspace: str = "/tmp/pytriton-a"
    """A parameter of the model's config that the server writes anew at each start, as
    PyTriton does its workspace folder."""
    calls: list[int] = field(default_factory=list)
    """Rows of each inference call."""
    headers: list[dict[str, str]] = field(default_factory=list)
    held: bool = False
    """``async_infer`` calls wait in ``waiting`` until the test lets each go."""
    waiting: list[threading.Event] = field(default_factory=list)
    """One gate per ``async_infer`` call sent (held ones), in the order sent."""
    in_flight: int = 0
    peak: int = 0
    """Most ``async_infer`` calls outstanding at once."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def module(self) -> Any:
        return SimpleNamespace(
            InferenceServerClient=lambda url, **_tls: self,
            InferInput=_Input,
            InferRequestedOutput=_Output,
        )

    def _fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    def get_model_metadata(self, model: str, version: str = "", **_call: Any) -> _Described:
        self._fail()
        if version and version not in self.versions:
            raise TritonFailure(
                "NOT_FOUND", f"Request for unknown model: '{model}' version {version} is not found"
            )
        return _Described(
            {
                "name": model,
                "platform": "python",
                "versions": self.versions,
                "inputs": [_Tensor("x", "FP32", [-1, self.width])],
                "outputs": [_Tensor("score", "FP32", [-1, 1])],
            }
        )

    def get_model_config(self, model: str, version: str = "", **_call: Any) -> Any:
        self._fail()
        score = _OutputConfig("score", [1], [] if self.per_row_score else None)
        described = {
            "max_batch_size": self.max_batch_size,
            "output": [score],
            "parameters": {"workspace-path": self.workspace},
        }
        return SimpleNamespace(config=_Described(described))

    def is_server_live(self, **_call: Any) -> bool:
        self._fail()
        return True

    def is_model_ready(self, model: str, version: str = "", **_call: Any) -> bool:
        self._fail()
        return version in self.ready

    def infer(
        self, model: str, inputs: list[_Input], *, headers: dict[str, str], **_call: Any
    ) -> Any:
        self._fail()
        (x,) = inputs
        assert x.data is not None and x.datatype == "FP32"
        assert len(x.data) <= self.max_batch_size, "the client must split at max_batch_size"
        self.calls.append(len(x.data))
        self.headers.append(headers)
        score = x.data.sum(axis=1, keepdims=True).astype(np.float32)
        return SimpleNamespace(as_numpy=lambda name: score if name == "score" else None)

    def async_infer(
        self, model: str, inputs: list[_Input], callback: Callable[[Any, Any], None], **call: Any
    ) -> None:
        """As the client's: the call runs on a thread of its own (held until its gate in
        ``waiting`` is set) and its answer or error goes to ``callback``."""
        gate = threading.Event()
        if not self.held:
            gate.set()
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.waiting.append(gate)

        def run() -> None:
            gate.wait(30)
            try:
                result, error = self.infer(model, inputs, **call), None
            except TritonFailure as exc:
                result, error = None, exc
            with self._lock:
                self.in_flight -= 1
            callback(result, error)

        threading.Thread(target=run, daemon=True).start()

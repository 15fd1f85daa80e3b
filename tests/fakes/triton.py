"""A fake Triton server for ``TritonEngine``'s unit tests: what ``tritonclient.grpc``
hands the engine (its client, ``InferInput``, ``InferRequestedOutput``), answering like
a server with one model that sums its input's columns (``x`` FP32 [-1, width] ->
``score`` FP32 [-1, 1]), dynamic batching up to ``max_batch_size`` rows."""

from __future__ import annotations

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
    calls: list[int] = field(default_factory=list)
    """Rows of each inference call."""
    headers: list[dict[str, str]] = field(default_factory=list)

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
        return _Described(
            {
                "name": model,
                "versions": self.versions,
                "inputs": [_Tensor("x", "FP32", [-1, self.width])],
                "outputs": [_Tensor("score", "FP32", [-1, 1])],
            }
        )

    def get_model_config(self, model: str, version: str = "", **_call: Any) -> Any:
        self._fail()
        return SimpleNamespace(config=_Described({"max_batch_size": self.max_batch_size}))

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

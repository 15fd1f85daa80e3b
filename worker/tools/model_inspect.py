"""``streamfer model inspect``: what an ONNX file declares and where it can run.

The graph is read with ``onnx`` (the ``tools`` extra; the worker itself never needs
it): inputs with their type, shape and the numpy dtype the worker feeds them, outputs
(a ZipMap's ``seq(map(...))`` included), opset imports per domain, the ops per domain,
producer, IR version, file size and SHA-256. Types are written as ONNX Runtime names
them (``tensor(float)``), the names a worker's config and logs use.

Providers are checked, not assumed: for TensorRT, CUDA and CPU (and any other provider
this onnxruntime build offers) it says whether the build offers it and, if so, whether a
session created with it keeps it. ONNX Runtime falls back to CPU without failing when a
provider's libraries are missing, so "loads" is read back from ``session.get_providers()``.
A missing or unreadable file is a ``ConfigError``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from worker.core import install_command
from worker.errors import ConfigError
from worker.inference import ONNX_DTYPES, file_sha256

__all__ = [
    "ModelInfo",
    "ProviderCheck",
    "TensorInfo",
    "check_providers",
    "inspect_model",
    "load_onnx",
    "type_string",
]

CHECKED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
"""Listed whether this build offers them or not."""

# Every CPU wheel offers it, and it runs no node of a local model: listing it as
# "loads the model" would mislead.
_NOT_LISTED = frozenset({"AzureExecutionProvider"})

ONNX_DOMAIN = "ai.onnx"
"""The standard operator set; ONNX files write it as the empty domain."""

Dim = int | str | None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type: str
    """As ONNX Runtime names it: ``tensor(float)``, ``seq(map(int64,tensor(float)))`` ..."""
    shape: list[Dim] | None
    """Fixed sizes, symbolic names, None for an unnamed open dimension; None: no shape."""
    feeds: str | None = None
    """Inputs: the numpy dtype a worker feeds (``str`` for strings); None: it cannot."""

    def text(self) -> str:
        shape = "" if self.shape is None else "[" + ", ".join(_dim(d) for d in self.shape) + "]"
        return f"{self.name}  {self.type}{shape}"


@dataclass(frozen=True, slots=True)
class ProviderCheck:
    name: str
    offered: bool
    """This onnxruntime build has it (``get_available_providers``)."""
    loads: bool | None
    """A session created with it keeps it; None when not offered."""
    note: str


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: str
    size_bytes: int
    sha256: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    ops: dict[str, dict[str, int]]
    """Domain -> op type -> node count."""
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    providers: list[ProviderCheck]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [
            f"model     {self.path}",
            f"file      {self.size_bytes:,} bytes, sha256 {self.sha256}",
            f"producer  {self.producer or '(none)'}, IR version {self.ir_version}",
            "opsets    " + ", ".join(f"{d} {v}" for d, v in self.opsets.items()),
        ]
        for domain, ops in self.ops.items():
            counted = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops.items())
            lines.append(f"ops       {domain}: {counted}")
        lines.append("inputs")
        for t in self.inputs:
            fed = f"fed as {t.feeds}" if t.feeds else "the worker cannot feed this type"
            lines.append(f"  {t.text()}  ({fed})")
        lines.append("outputs")
        lines += [f"  {t.text()}" for t in self.outputs]
        lines.append("providers")
        width = max((len(p.name) for p in self.providers), default=0)
        lines += [f"  {p.name:<{width}}  {p.note}" for p in self.providers]
        return "\n".join(lines)


def load_onnx(path: Path, *, weights: bool = True) -> Any:
    """The ``onnx.ModelProto`` of ``path``; ConfigError when onnx is missing (naming the
    extra), or the file is missing or not an ONNX model."""
    try:
        import onnx
    except ImportError as exc:
        raise ConfigError(
            f"the model commands need onnx (the tools extra): {install_command('tools')}"
        ) from exc
    if not path.is_file():
        raise ConfigError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=weights)
    except Exception as exc:  # protobuf's untyped DecodeError, OSError, bad external data
        raise ConfigError(f"{path} is not a readable ONNX model: {exc}") from exc
    if model.ir_version == 0 or not model.graph.node:
        raise ConfigError(f"{path} is not an ONNX model: it has no IR version or no nodes")
    return model


def inspect_model(path: Path) -> ModelInfo:
    """Read ``path`` and check each provider on it. Raises ConfigError (see ``load_onnx``)."""
    model = load_onnx(path, weights=False)
    graph = model.graph
    initialized = {t.name for t in graph.initializer}
    inputs = []
    for value in graph.input:
        if value.name in initialized:  # IR < 4 lists weights as inputs
            continue
        info = _tensor_info(value)
        dtype = ONNX_DTYPES.get(info.type)
        fed = None if dtype is None else "str" if dtype.kind == "O" else str(dtype)
        inputs.append(TensorInfo(info.name, info.type, info.shape, fed))
    ops: dict[str, Counter[str]] = {}
    for node in graph.node:
        ops.setdefault(node.domain or ONNX_DOMAIN, Counter())[node.op_type] += 1
    producer = f"{model.producer_name} {model.producer_version}".strip()
    return ModelInfo(
        path=str(path),
        size_bytes=path.stat().st_size,
        sha256=file_sha256(path),
        ir_version=int(model.ir_version),
        producer=producer,
        opsets=dict(
            sorted(
                ((o.domain or ONNX_DOMAIN, int(o.version)) for o in model.opset_import),
                key=lambda item: _domain_order(item[0]),
            )
        ),
        ops={d: dict(ops[d].most_common()) for d in sorted(ops, key=_domain_order)},
        inputs=inputs,
        outputs=[_tensor_info(v) for v in graph.output],
        providers=check_providers(path, cpu_only_domains=set(ops) - {ONNX_DOMAIN}),
    )


def check_providers(path: Path, cpu_only_domains: set[str] | None = None) -> list[ProviderCheck]:
    """TensorRT, CUDA, CPU and any other provider offered here, each tried on ``path``.

    ``cpu_only_domains`` (ai.onnx.ml, say) are named in the note of a provider other than
    CPU that loads: ONNX Runtime runs their nodes on CPU, having no kernels for them there.
    """
    import onnxruntime as ort

    available = ort.get_available_providers()
    listed = [
        p
        for p in ort.get_all_providers()
        if p in CHECKED_PROVIDERS or (p in available and p not in _NOT_LISTED)
    ]
    checks = []
    for provider in listed:
        if provider not in available:
            checks.append(ProviderCheck(provider, False, None, "not in this onnxruntime build"))
            continue
        options = ort.SessionOptions()
        options.log_severity_level = 3  # the fallback is reported here, not logged
        try:
            kept = ort.InferenceSession(str(path), options, providers=[provider]).get_providers()
        except Exception as exc:  # onnxruntime raises its own untyped errors
            reason = str(exc).strip().splitlines()[0][:300]
            checks.append(ProviderCheck(provider, True, False, f"does not load it: {reason}"))
            continue
        if provider not in kept:
            note = f"offered, but the session fell back to {', '.join(kept)}"
            checks.append(ProviderCheck(provider, True, False, note))
            continue
        note = "loads the model"
        if provider != "CPUExecutionProvider" and cpu_only_domains:
            note += f" ({', '.join(sorted(cpu_only_domains))} nodes run on CPU)"
        checks.append(ProviderCheck(provider, True, True, note))
    return checks


def type_string(value_type: Any) -> str:
    """An ``onnx.TypeProto`` as ONNX Runtime writes it: ``tensor(float)``,
    ``seq(map(int64,tensor(float)))`` ..."""
    which = value_type.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({_element(value_type.tensor_type.elem_type)})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({_element(value_type.sparse_tensor_type.elem_type)})"
    if which == "sequence_type":
        return f"seq({type_string(value_type.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({type_string(value_type.optional_type.elem_type)})"
    if which == "map_type":
        key = _element(value_type.map_type.key_type)
        return f"map({key},{type_string(value_type.map_type.value_type)})"
    return "unknown"


def _element(elem_type: int) -> str:
    from onnx import TensorProto

    return str(TensorProto.DataType.Name(elem_type)).lower()


def _tensor_info(value: Any) -> TensorInfo:
    shape: list[Dim] | None = None
    which = value.type.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(value.type, which)
        if tensor.HasField("shape"):
            shape = [
                int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim
            ]
    return TensorInfo(value.name, type_string(value.type), shape)


def _domain_order(domain: str) -> tuple[bool, str]:
    """The standard domain first, then by name: exporters write them in any order."""
    return domain != ONNX_DOMAIN, domain


def _dim(dim: Dim) -> str:
    return "?" if dim is None else str(dim)

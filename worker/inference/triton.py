"""A model that a Triton Inference Server runs, as an ``InferenceEngine``.

The worker keeps Kafka, batching, enrichment and delivery; the server keeps the model
(a GPU fleet, another team's model). At start-up ``TritonEngine`` asks the server for the
model's metadata and config (input and output names, datatypes, shapes,
``max_batch_size``) and describes its inputs as ``TensorInput``, so ``FeedPlan`` checks
them against the pipeline's features exactly as it checks an ONNX file's. A batch is one
gRPC ``ModelInfer`` call (KServe v2 protocol, ``tritonclient.grpc``), split at the
server's ``max_batch_size`` into calls sent together (``worker.inference.in_flight``,
at most ``max_calls_in_flight`` outstanding), each with the configured timeout. An
output the server reshapes from one value a row is handed on as ``[batch]``, as the
same model run locally gives it.

What a failed call means decides what happens to the batch (``call_failure``): a server
that cannot answer (unreachable, past the timeout, overloaded, not serving the model) is
an ``InferenceServerError``, an outage the infer step waits out without dead-lettering
anything; the model refusing the batch (its code raised, the inputs do not fit) is an
``EngineError``, which takes the same per-row path as a local model's error.

``tritonclient`` is an optional dependency (the ``triton`` extra): it is imported when an
engine is made, so a worker without it starts every other engine.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.config import ModelSpec, TritonSettings
from worker.errors import EngineError, InferenceServerError
from worker.inference.engine import Example, Feeds, Outputs, TensorInput
from worker.inference.in_flight import Answered, in_flight
from worker.inference.outputs import output_map, unpublishable

__all__ = ["TRITON_PROVIDER", "TritonEngine", "call_failure"]

log = logging.getLogger(__name__)

TRITON_PROVIDER = "triton"
"""What ``provider`` says for a model a server runs (metrics, ``check``)."""

# KServe v2 datatype -> (ONNX Runtime's type name, the numpy dtype fed and read back)
_DATATYPES: dict[str, tuple[str, np.dtype[Any]]] = {
    v2: (f"tensor({onnx})", np.dtype(numpy))
    for v2, onnx, numpy in (
        ("FP32", "float", "float32"),
        ("FP64", "double", "float64"),
        ("FP16", "float16", "float16"),
        ("INT64", "int64", "int64"),
        ("INT32", "int32", "int32"),
        ("INT16", "int16", "int16"),
        ("INT8", "int8", "int8"),
        ("UINT64", "uint64", "uint64"),
        ("UINT32", "uint32", "uint32"),
        ("UINT16", "uint16", "uint16"),
        ("UINT8", "uint8", "uint8"),
        ("BOOL", "bool", "bool"),
        ("BYTES", "string", "object"),
    )
}

# gRPC status codes of a server that cannot answer now; any other failure of a call is
# the model refusing the batch. NOT_FOUND / UNAVAILABLE also cover a model the server is
# (re)loading or has unloaded: no record is at fault for that either.
_OUTAGE_CODES = frozenset(
    {
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "RESOURCE_EXHAUSTED",
        "CANCELLED",
        "ABORTED",
        "NOT_FOUND",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "UNIMPLEMENTED",
    }
)
_NOT_SERVING = ("is not ready", "unknown model", "is not found", "no version is available")

Counted = Callable[[str], None]
"""Hears each failed call's kind: ``unavailable`` or ``model``."""


def call_failure(exc: Exception, where: str) -> InferenceServerError | EngineError:
    """What a failed call to the server means: an outage (``InferenceServerError``) or
    the model refusing the batch (``EngineError``), with the server's own words."""
    status, message = getattr(exc, "status", None), getattr(exc, "message", None)
    code = str(status() or "") if callable(status) else ""
    code = code.removeprefix("StatusCode.")
    text = _summary(str(message() if callable(message) else exc))
    outage = not code or code in _OUTAGE_CODES or any(s in text.lower() for s in _NOT_SERVING)
    if outage:
        return InferenceServerError(f"inference server {where}: {code or 'no answer'}: {text}")
    return EngineError(f"model {where} refused the batch: {code}: {text}")


_RAISED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$", re.MULTILINE)


def _summary(message: str) -> str:
    """The server's words, short enough for a dead letter's reason: a backend's traceback
    becomes the error it ends with, then the message's first line."""
    raised = [m for m in _RAISED.finditer(message) if "Traceback" not in m.group(2)]
    first = " ".join(message.strip().splitlines()[0].split()) if message.strip() else ""
    if not raised:
        return first[:400]
    last = raised[-1]
    return f"{last.group(1)}: {last.group(2).strip()[:200]} ({first[:150]})"


class TritonEngine:
    """One model on one Triton server (see the module). ``infer`` blocks for the calls;
    it is called from one thread (the infer stage, or the reloader's warm-up).

    ``on_call`` hears the seconds of every call, ``on_error`` the kind of every failed
    one (the worker's metrics). Raises ``InferenceServerError`` when the server cannot
    answer at start-up or serves no ready version of the model, ``EngineError`` when the
    model has inputs or outputs the worker cannot feed or publish."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        on_call: Callable[[float], None] | None = None,
        on_error: Counted | None = None,
        grpc: Any | None = None,
    ) -> None:
        settings = spec.triton
        if settings is None:
            raise EngineError(f"model {spec.name!r} names no Triton server")
        self.settings = settings
        self.model = settings.model or spec.name
        self._timeout = settings.timeout_s
        self._max_in_flight = settings.max_calls_in_flight
        self._headers = {k: v.get_secret_value() for k, v in settings.headers.items()}
        self._on_call = on_call or (lambda _s: None)
        self._on_error = on_error or (lambda _k: None)
        self._grpc = grpc if grpc is not None else client_module()
        self._client = connect(settings, self._grpc)
        self.served_version = settings.version or self._latest()
        """The version this engine calls; results and dead letters name it."""
        self.where = f"{self.model}:{self.served_version} at {settings.url}"
        metadata, config = self._describe()
        self.max_batch_size = int(config.max_batch_size)
        """0: the model takes no batch dimension, so batches go whole (as the server says)."""
        batched = self.max_batch_size > 0
        self._inputs = [_tensor(i, batched, self.where) for i in metadata.inputs]
        self._datatypes = [i.datatype for i in metadata.inputs]
        names = [o.name for o in metadata.outputs]
        self.output_types: dict[str, str] = {
            o.name: _DATATYPES.get(o.datatype, (o.datatype, None))[0] for o in metadata.outputs
        }
        self._outputs = output_map(spec.outputs, names, self.where)
        self._wanted = list(self._outputs.values())
        self._per_row = _per_row_scalars(config, batched)
        self.signature = _signature(metadata)
        """SHA-256 of what the model takes and gives (see ``_signature``): a replay's
        resume checks it."""
        self._hash = _identity(self.model, self.served_version, self.signature, config)
        self.provider = TRITON_PROVIDER
        self.providers = [TRITON_PROVIDER]
        self.requested = [TRITON_PROVIDER]

    def _rpc(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One call that is not a batch (metadata, health), failures as ``call_failure``."""
        try:
            return call(*args, headers=self._headers, client_timeout=self._timeout, **kwargs)
        except Exception as exc:
            failure = call_failure(exc, f"{self.settings.url} ({what} of {self.model})")
            raise failure from exc

    def _latest(self) -> str:
        found = self.latest_version()
        if found is None:
            raise InferenceServerError(
                f"inference server {self.settings.url} has no version of model {self.model} ready"
            )
        return found

    def ready_versions(self) -> list[str]:
        """The versions of the model the server lists, lowest first."""
        metadata = self._rpc("metadata", self._client.get_model_metadata, self.model)
        return sorted((str(v) for v in metadata.versions), key=_version_key)

    def latest_version(self) -> str | None:
        """The highest version of the model the server has ready, or None."""
        for version in reversed(self.ready_versions()):
            if self._rpc("readiness", self._client.is_model_ready, self.model, version):
                return version
        return None

    def _describe(self) -> tuple[Any, Any]:
        version = self.served_version
        metadata = self._rpc("metadata", self._client.get_model_metadata, self.model, version)
        config = self._rpc("config", self._client.get_model_config, self.model, version).config
        return metadata, config

    def health(self) -> list[tuple[str, bool, str]]:
        """(what, ok, detail) for ``streamfer check``: the server live, the model ready."""
        lines: list[tuple[str, bool, str]] = []
        url = self.settings.url
        try:
            live = bool(self._rpc("liveness", self._client.is_server_live))
            lines.append(("triton server", live, f"{url} {'live' if live else 'not live'}"))
            ready = bool(
                self._rpc("readiness", self._client.is_model_ready, self.model, self.served_version)
            )
            lines.append(
                ("triton model", ready, f"{self.where} {'ready' if ready else 'not ready'}")
            )
        except (InferenceServerError, EngineError) as exc:
            lines.append(("triton server", False, str(exc)))
        return lines

    @property
    def inputs(self) -> list[TensorInput]:
        return list(self._inputs)

    @property
    def outputs(self) -> dict[str, str]:
        """Result field -> model output name."""
        return dict(self._outputs)

    @property
    def model_hash(self) -> str:
        """The served model's identity (``_identity``): the same on every start of the
        server while its model is, another for another version, signature or batch shape,
        so results, the output cache and hot reload tell models apart, not restarts."""
        return self._hash

    def infer(self, feeds: Feeds | npt.NDArray[Any]) -> Outputs:
        """One call per ``max_batch_size`` rows. Raises ``InferenceServerError`` when the
        server cannot answer, ``EngineError`` when the model refuses the rows."""
        if isinstance(feeds, np.ndarray):
            feeds = {self._inputs[0].name: feeds}
        rows = len(next(iter(feeds.values()))) if feeds else 0
        largest = self.max_batch_size
        if largest <= 0 or rows <= largest:
            return self._call(feeds, rows)
        parts = [
            {k: v[start : start + largest] for k, v in feeds.items()}
            for start in range(0, rows, largest)
        ]
        if self._max_in_flight <= 1:
            answers = [self._call(part, len(next(iter(part.values())))) for part in parts]
        else:
            answers = self._in_flight(parts)
        return {name: np.concatenate([p[name] for p in answers]) for name in answers[0]}

    def _request(self, feeds: Feeds) -> tuple[list[Any], list[Any]]:
        """The inputs and requested outputs of one call."""
        grpc = self._grpc
        requests = []
        for t, datatype in zip(self._inputs, self._datatypes, strict=True):
            values = np.ascontiguousarray(feeds[t.name])
            given = grpc.InferInput(t.name, list(values.shape), datatype)
            given.set_data_from_numpy(values)
            requests.append(given)
        return requests, [grpc.InferRequestedOutput(name) for name in self._wanted]

    def _failed(self, exc: Exception, rows: int) -> InferenceServerError | EngineError:
        """A failed call, counted and told apart (``call_failure``)."""
        failure = call_failure(exc, f"{self.where} ({rows} rows)")
        self._on_error("unavailable" if isinstance(failure, InferenceServerError) else "model")
        return failure

    def _call(self, feeds: Feeds, rows: int) -> Outputs:
        requests, wanted = self._request(feeds)
        started = time.perf_counter()
        try:
            answer = self._client.infer(
                self.model,
                requests,
                model_version=self.served_version,
                outputs=wanted,
                headers=self._headers,
                client_timeout=self._timeout,
            )
        except Exception as exc:
            raise self._failed(exc, rows) from exc
        finally:
            self._on_call(time.perf_counter() - started)
        return self._read(answer)

    def _in_flight(self, parts: Sequence[Feeds]) -> list[Outputs]:
        """The parts of one batch as concurrent calls (``worker.inference.in_flight``),
        at most ``max_calls_in_flight`` at once; a failed one fails the batch, an outage
        before a refusal of the model."""

        def send(i: int, answered: Answered) -> None:
            requests, wanted = self._request(parts[i])
            started = time.perf_counter()

            def timed(result: Any, error: Exception | None) -> None:
                self._on_call(time.perf_counter() - started)
                answered(result, error)

            self._client.async_infer(
                self.model,
                requests,
                timed,
                model_version=self.served_version,
                outputs=wanted,
                headers=self._headers,
                client_timeout=self._timeout,
            )

        answers = in_flight(send, len(parts), self._max_in_flight, self._timeout + 5.0)
        failures = [
            (self._failed(a, len(next(iter(parts[i].values())))), a)
            for i, a in enumerate(answers)
            if isinstance(a, Exception)
        ]
        if failures:
            outages = [f for f in failures if isinstance(f[0], InferenceServerError)]
            failure, cause = (outages or failures)[0]
            raise failure from cause
        return [self._read(answer) for answer in answers]

    def _read(self, answer: Any) -> Outputs:
        """The outputs of one call's answer, as the worker hands them on."""
        outputs: Outputs = {}
        for field, name in self._outputs.items():
            values = answer.as_numpy(name)
            if values is None:
                raise EngineError(f"model {self.where} gave no output {name!r}")
            if values.dtype.kind in "OS":  # BYTES: text, as a local model's strings
                values = np.char.decode(values.astype(np.bytes_), "utf-8").astype(object)
            if name in self._per_row and values.ndim == 2 and values.shape[1] == 1:
                values = values.reshape(-1)  # one value a row, as the model gives it
            outputs[field] = values
        return outputs

    def example(self, widths: Mapping[str, int] | None = None) -> Example:
        """Feeds the model accepts, for warm-up: zeros, and empty strings for text."""
        given = widths or {}
        width_of = {t.name: t.width or given.get(t.name, 1) for t in self._inputs}

        def feeds(n: int) -> Feeds:
            out: dict[str, npt.NDArray[Any]] = {}
            for t in self._inputs:
                shape = (n,) if t.rank == 1 else (n, width_of[t.name])
                out[t.name] = (
                    np.full(shape, "", dtype=object)
                    if t.onnx_type == "tensor(string)"
                    else np.zeros(shape, dtype=t.dtype)
                )
            return out

        return feeds

    def warm_up(self, batch_sizes: Iterable[int], example: Example | None = None) -> None:
        """One call per batch size; raises ``EngineError`` naming an output the worker
        could not publish, like ``OnnxEngine.warm_up``."""
        feeds = example or self.example()
        started = time.perf_counter()
        sizes = list(batch_sizes) or [1]
        for size in sizes:
            for field, values in self.infer(feeds(size)).items():
                why = unpublishable(values, size)
                if why is not None:
                    raise EngineError(
                        f"model {self.where}: output {field!r} cannot be published: {why}"
                    )
        log.info(
            "model %s warmed at batch sizes %s in %.0f ms (max_batch_size %d)",
            self.where,
            sizes,
            1000 * (time.perf_counter() - started),
            self.max_batch_size,
        )


def _signature(metadata: Any) -> str:
    """SHA-256 of the model's platform, inputs and outputs (names, datatypes, shapes) as
    its metadata lists them: the same wherever this version of the model is served. The
    config is left out (a server may rewrite it on each start, as PyTriton does its
    workspace path, or with its instance count), and so is the list of versions."""
    described = [
        str(getattr(metadata, "platform", "")),
        [[t.name, t.datatype, [int(d) for d in t.shape]] for t in metadata.inputs],
        [[t.name, t.datatype, [int(d) for d in t.shape]] for t in metadata.outputs],
    ]
    return hashlib.sha256(repr(described).encode()).hexdigest()


def _identity(model: str, version: str, signature: str, config: Any) -> str:
    """SHA-256 of the model's name, version and signature (``_signature``) and of what
    its config says about a batch's shape: ``max_batch_size`` and each output's dims and
    reshape. Not the whole config, which the server writes anew at each start (PyTriton
    puts its workspace, a new temporary folder, in the model's parameters) and in which an
    instance count or a batching delay changes no answer; nor the metadata's list of
    versions, which grows with each version the server loads."""
    outputs = [
        [
            o.name,
            [int(d) for d in o.dims],
            [int(d) for d in o.reshape.shape] if o.HasField("reshape") else None,
        ]
        for o in getattr(config, "output", ())
    ]
    described = [model, version, signature, int(config.max_batch_size), outputs]
    return hashlib.sha256(repr(described).encode()).hexdigest()


def _per_row_scalars(config: Any, batched: bool) -> frozenset[str]:
    """Outputs the model gives as one value a row (shape ``[batch]``), which a batching
    server declares as ``dims: [1]`` with ``reshape: { shape: [] }`` (Triton's ONNX
    Runtime backend does so for such an output) and answers as ``[batch, 1]``: the
    engine hands them on as ``[batch]``, so a result is what the same model run locally
    gives (a number, not a one-element list)."""
    if not batched:
        return frozenset()
    return frozenset(
        o.name
        for o in getattr(config, "output", ())
        if list(o.dims) == [1] and o.HasField("reshape") and not list(o.reshape.shape)
    )


def client_module() -> Any:
    """``tritonclient.grpc``, or EngineError saying how to install it."""
    try:
        import tritonclient.grpc
    except ImportError as exc:
        raise EngineError(
            "engine = \"triton\" needs tritonclient: pip install 'streamfer[triton]'"
        ) from exc
    return tritonclient.grpc


def connect(settings: TritonSettings, grpc: Any) -> Any:
    """A gRPC client of the server (no call is made yet)."""

    def text(path: Any) -> str | None:
        return None if path is None else str(path)

    return grpc.InferenceServerClient(
        settings.url,
        ssl=settings.ssl,
        root_certificates=text(settings.root_certificates),
        private_key=text(settings.private_key),
        certificate_chain=text(settings.certificate_chain),
    )


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def _tensor(declared: Any, batched: bool, where: str) -> TensorInput:
    """A server's input as ``FeedPlan`` reads an ONNX one: rank and width, the batch
    dimension included (the metadata's shape starts with it, -1 when the server batches)."""
    shape = [int(d) for d in declared.shape]
    if not batched:  # no batch dimension the server adds: the first one is the batch
        shape = [-1, *shape[1:]] if shape else shape
    onnx_type, dtype = _DATATYPES.get(declared.datatype, (declared.datatype, None))
    if dtype is None:
        raise EngineError(f"model {where}: input {declared.name!r} is {declared.datatype}")
    rank = len(shape)
    width = shape[-1] if rank == 2 and shape[-1] > 0 else None
    return TensorInput(declared.name, onnx_type, dtype, rank, 1 if rank == 1 else width)

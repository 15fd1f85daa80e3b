"""The model a pipeline serves and where it runs: the ONNX file, its inputs and outputs,
the execution providers in order, and their options (``CudaOptions``,
``TensorrtOptions``), or the Triton Inference Server that runs it instead
(``TritonSettings``). ``worker.inference`` reads these; the schema itself loads nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from worker.config.base import Frozen

__all__ = ["CudaOptions", "Engine", "ModelSpec", "Provider", "TensorrtOptions", "TritonSettings"]

Provider = Literal["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"]
_CPU: Provider = "CPUExecutionProvider"
Engine = Literal["onnxruntime", "triton"]


class CudaOptions(Frozen):
    """ONNX Runtime's CUDA provider, as ``[pipelines.model.cuda]``; also the device
    TensorRT runs on. See ``worker.inference.providers.provider_options`` for the option names."""

    device_id: int = Field(
        default=0, ge=0, le=255, description="The GPU to run on (CUDA and TensorRT)."
    )
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field(
        default="EXHAUSTIVE",
        description=(
            "How cuDNN picks convolution kernels: benchmarked once per shape "
            "(EXHAUSTIVE, Runtime's default), guessed (HEURISTIC) or fixed "
            "(DEFAULT)."
        ),
    )
    arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] = Field(
        default="kNextPowerOfTwo",
        description=(
            "How the device memory arena grows; kSameAsRequested keeps several "
            "processes that share one device from each reserving powers of two."
        ),
    )
    gpu_mem_limit_mb: int | None = Field(
        default=None,
        ge=16,
        description="The arena's ceiling in MiB (None: Runtime's default, no limit).",
    )


class TensorrtOptions(Frozen):
    """ONNX Runtime's TensorRT provider, as ``[pipelines.model.tensorrt]``. Relative
    directories resolve against the config file's directory; each must be writable when
    TensorRT is among the providers (start-up fails naming it otherwise)."""

    fp16: bool = Field(default=False, description="Let TensorRT build float16 kernels.")
    engine_cache_dir: Path | None = Field(
        default=None,
        description=(
            "Built engines are kept here (a volume) and reused at the next start of"
            " the same model, TensorRT version and GPU; None: an engine is built at"
            " every start."
        ),
    )
    timing_cache_dir: Path | None = Field(
        default=None,
        description=("TensorRT's kernel timings, which make the next build of any model faster."),
    )
    max_workspace_mb: int | None = Field(
        default=None, ge=16, description="TensorRT's builder workspace in MiB; None: its default."
    )
    builder_optimization_level: int | None = Field(
        default=None,
        ge=0,
        le=5,
        description="TensorRT's builder optimisation level (0-5); None: its default.",
    )


class TritonSettings(Frozen):
    """A Triton Inference Server that runs the model (over the KServe v2 gRPC protocol), as
    ``[pipelines.model.triton]``; the worker reads the model's inputs, outputs and
    ``max_batch_size`` from it at start-up. Relative certificate paths resolve against
    the config file's directory."""

    url: str = Field(
        pattern=r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$",
        description="The server's gRPC address, host:port (Triton listens on 8001 by default).",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        description="The model's name on the server; default: the pipeline's model.name.",
    )
    version: str | None = Field(
        default=None,
        pattern=r"^[1-9][0-9]*$",
        description="The model version to serve; default: the highest version the server "
        "has ready, and with model.watch a higher one is served once the server has it.",
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Longest wait for one call; a call past it is an outage of the server "
        "(the batch waits and is tried again), never a dead letter.",
    )
    max_calls_in_flight: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Most calls of one batch outstanding at once: a batch larger than "
        "the model's max_batch_size goes as several calls, sent together so that the "
        "server's instances work on them side by side; 1 sends them one after another.",
    )
    ssl: bool = Field(default=False, description="Speak TLS to the server.")
    root_certificates: Path | None = Field(
        default=None,
        description="PEM file of the CAs that signed the server's certificate (TLS); "
        "default: the system's.",
    )
    private_key: Path | None = Field(
        default=None, description="PEM file of the worker's private key, for mutual TLS."
    )
    certificate_chain: Path | None = Field(
        default=None, description="PEM file of the worker's certificate chain, for mutual TLS."
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="gRPC metadata sent with every call (an API key or bearer token, say); "
        "the values never print.",
    )

    @model_validator(mode="after")
    def _tls_files_need_ssl(self) -> TritonSettings:
        files = (self.root_certificates, self.private_key, self.certificate_chain)
        if not self.ssl and any(f is not None for f in files):
            raise ValueError("root_certificates, private_key and certificate_chain need ssl = true")
        if (self.private_key is None) != (self.certificate_chain is None):
            raise ValueError("private_key and certificate_chain go together (mutual TLS)")
        return self


class ModelSpec(Frozen):
    """An ONNX model file, how to name it in results, and where to run it.

    ``inputs`` maps each model input to the features that fill its columns, in order; by
    default a model with one input gets every stored feature, and a model whose inputs
    are named after features gets each its own. ``outputs`` maps result field names to
    model output names; by default a classifier's label and probability outputs (as
    skl2onnx names them) become ``label`` and ``scores``, and any other model's outputs
    keep their own names. ``class_names`` turns the ``label`` output's class index into a
    name (it may also be written inside the ``outputs`` table).

    ``providers`` are tried in order (TensorRT, CUDA, CPU); one that cannot load is
    skipped with a warning that says why. ``pad_to_buckets`` runs every batch at one of
    the warmed batch sizes (``worker.inference.buckets``), ``io_binding`` through per-size bound
    host buffers (``worker.inference.device_io``); each is on by default when a GPU provider
    serves and off on the CPU, where neither pays.
    """

    path: Path | None = Field(
        default=None,
        description=(
            "The ONNX file, or a directory of numbered versions (each <n>/model.onnx),"
            ' relative to the config file; required unless engine = "triton".'
        ),
    )
    name: str = Field(min_length=1, description="The model's name, as results carry it.")
    engine: Engine = Field(
        default="onnxruntime",
        description="Where the model runs: ONNX Runtime in the worker (onnxruntime), or a "
        "Triton Inference Server over gRPC (triton, configured in [pipelines.model.triton]).",
    )
    triton: TritonSettings | None = Field(
        default=None, description='The server that runs the model when engine = "triton".'
    )
    version: str = Field(
        default="1",
        description=(
            "The version results carry for a file; for a directory, pins that "
            "version (then it is not followed)."
        ),
    )
    providers: list[Provider] = Field(
        default_factory=lambda: [_CPU],
        description=(
            "ONNX Runtime execution providers in order of preference; CUDA and "
            "TensorRT need the streamfer-gpu build."
        ),
    )
    intra_op_threads: int = Field(
        default=1, ge=0, le=256, description="ONNX Runtime's threads within one operator."
    )
    inputs: dict[str, list[str]] | None = Field(
        default=None,
        description=(
            "ONNX input name -> the features that feed it, in column order; None: "
            "inferred from the model and the lookups."
        ),
    )
    outputs: dict[str, str] | None = Field(
        default=None,
        description=(
            "Result field -> ONNX output name; None: every output under its own "
            "name (a classifier's label and probabilities as label and scores)."
        ),
    )
    class_names: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Names for the label's class indexes, in class order, written in "
            "results instead of the index."
        ),
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Refuse to start (or reload) if the model file has another SHA-256.",
    )
    cuda: CudaOptions = Field(
        default=CudaOptions(), description="Options for the CUDA execution provider."
    )
    tensorrt: TensorrtOptions = Field(
        default=TensorrtOptions(), description="Options for the TensorRT execution provider."
    )
    deterministic: bool = Field(
        default=True,
        description=(
            "False: the model may answer the same inputs differently (sampling, "
            "dropout left on, a random seed per run), so its outputs are never "
            "cached (`cache.enabled` is refused)."
        ),
    )
    pad_to_buckets: bool | None = Field(
        default=None, description="None: on when the serving provider is CUDA or TensorRT."
    )
    io_binding: bool | None = Field(
        default=None,
        description=(
            "None: on when batches are padded and the serving provider is CUDA or "
            "TensorRT; models with string or map inputs or outputs are never bound."
        ),
    )
    watch: bool | None = Field(
        default=None,
        description=(
            "Look for a new model every `reload_poll_s` and serve it without a "
            "restart (`worker.models.reloader`). None: on when `path` is a "
            "directory of versions, off for a file (which SIGHUP or `POST /reload` "
            "still make the worker look at)."
        ),
    )
    reload_poll_s: float = Field(
        default=3.0,
        gt=0,
        le=3600,
        description="How often a watched model is looked at for a new version.",
    )
    allow_provider_change: bool = Field(
        default=False,
        description=(
            "False: a new version that would be served by another execution "
            "provider than the live one (a CUDA model whose next version falls back"
            " to the CPU) is refused at the reload, and the live one keeps serving."
        ),
    )
    version_dir: Path | None = Field(
        default=None,
        description=(
            "Set when the config is loaded, never written: the directory of "
            "numbered versions that `path` named, when the worker follows its "
            "highest version (`path` then names that version's model.onnx, and "
            "`version` its name)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _class_names_may_sit_in_outputs(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("outputs"), dict):
            outputs = dict(data["outputs"])
            if "class_names" in outputs:
                if "class_names" in data:
                    raise ValueError("class_names is given twice: in model and in model.outputs")
                data = {**data, "class_names": outputs.pop("class_names"), "outputs": outputs}
        return data

    @property
    def where(self) -> str:
        """The model in words, for error messages: its file, or the server and name."""
        if self.triton is not None:
            return f"{self.triton.model or self.name} on Triton at {self.triton.url}"
        return str(self.path.name if self.path is not None else self.name)

    @property
    def file(self) -> Path:
        """The ONNX file of a model ONNX Runtime runs (the validator makes sure it is set)."""
        if self.path is None:
            raise ValueError(f"model {self.name!r} has no path: it runs on {self.engine}")
        return self.path

    @model_validator(mode="after")
    def _engine_has_its_model(self) -> ModelSpec:
        if self.engine == "triton":
            if self.triton is None:
                raise ValueError('engine = "triton" needs a [pipelines.model.triton] table (url)')
            if self.path is not None:
                raise ValueError('engine = "triton" runs the server\'s model; remove path')
        else:
            if self.path is None:
                raise ValueError("path: the ONNX model file (or a directory of versions)")
            if self.triton is not None:
                raise ValueError('a triton table needs engine = "triton"')
        return self

    @model_validator(mode="after")
    def _inputs_are_columns(self) -> ModelSpec:
        for name, columns in (self.inputs or {}).items():
            if not columns:
                raise ValueError(f"inputs.{name}: lists no features")
            if len(set(columns)) != len(columns):
                raise ValueError(f"inputs.{name}: a feature is listed twice")
        if self.io_binding and self.pad_to_buckets is False:
            raise ValueError(
                "io_binding = true needs pad_to_buckets (its buffers are bound per bucket)"
            )
        return self

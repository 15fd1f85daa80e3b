"""The configuration schema: typed, frozen settings, every value validated with a message
that names its field (``pipelines[0].batch.max_batch_size``) and what is allowed.

Only the shape and the rules live here; reading the file and the environment
(``worker.config.loading``) and what the file system resolves
(``worker.config.resolution``) are kept out, so the schema has no side effects.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)

from worker.config.redis_url import redis_url_problem
from worker.errors import ConfigError

__all__ = [
    "PRIORITY_NAMES",
    "BatchPolicy",
    "CacheSpec",
    "CanarySpec",
    "CandidateSpec",
    "CudaOptions",
    "FeatureSpec",
    "HooksSpec",
    "KafkaSettings",
    "LookupSpec",
    "MetricsSettings",
    "MissingPolicy",
    "ModelSpec",
    "PipelineConfig",
    "Priority",
    "RedisSettings",
    "RequestMapping",
    "ShadowSpec",
    "TensorrtOptions",
    "WorkerConfig",
    "is_loopback",
]


LibrdkafkaValue = str | int | float | bool
Provider = Literal["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"]
MissingPolicy = Literal["default", "dead_letter"]
_CPU: Provider = "CPUExecutionProvider"


PRIORITY_NAMES: dict[str, int] = {"interactive": 10, "normal": 0, "bulk": -10}
"""The named priorities and the integers they stand for: higher goes to the model first."""
_PRIORITY_RANGE = 100


def _check_priority(value: Any) -> Any:
    """A named priority or an integer within +-100; anything else names what is allowed."""
    if isinstance(value, str) and value in PRIORITY_NAMES:
        return value
    in_range = isinstance(value, int) and -_PRIORITY_RANGE <= value <= _PRIORITY_RANGE
    if in_range and not isinstance(value, bool):
        return value
    raise ValueError(
        f"must be {', '.join(repr(n) for n in PRIORITY_NAMES)} or an integer from "
        f"-{_PRIORITY_RANGE} to {_PRIORITY_RANGE} (higher goes first), got {value!r}"
    )


Priority = Annotated[int | str, BeforeValidator(_check_priority)]
"""A pipeline's place in the model's queue: a name of ``PRIORITY_NAMES`` or an integer."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)


class KafkaSettings(_Frozen):
    """Where the cluster is and how this worker joins its group.

    ``options`` go to both consumer and producer verbatim (security settings, for
    example); ``consumer_options`` and ``producer_options`` to one of them.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    group_id: str = "streamfer"
    auto_offset_reset: Literal["earliest", "latest", "error"] = "earliest"
    session_timeout_ms: int = Field(default=45000, ge=1000, le=3_600_000)
    heartbeat_interval_ms: int = Field(default=1000, ge=100, le=3_600_000)
    """How soon a member hears of a rebalance. A cooperative rebalance takes two rounds,
    so a replica added under load waits about two intervals for its partitions:
    librdkafka's default of 3 s made that 6 s."""
    max_poll_interval_ms: int = Field(default=300_000, ge=1000)
    group_instance_id: str | None = None
    group_coverage_check_s: float = Field(default=10.0, ge=0)
    """With ``group_instance_id``: how often to look for partitions no member of the
    settled group owns (``worker.kafka.group_coverage``); 0 never looks."""
    options: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    consumer_options: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    producer_options: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    """Read at start-up into ``sasl_password`` (a mounted Kubernetes secret, say)."""

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> KafkaSettings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be less than "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        return self

    def client_options(self) -> dict[str, LibrdkafkaValue]:
        """``options`` plus the SASL credentials, for both clients."""
        merged = dict(self.options)
        if self.sasl_username is not None:
            merged["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            merged["sasl.password"] = self.sasl_password.get_secret_value()
        return merged


class RedisSettings(_Frozen):
    """The feature store. The URL may carry a password, so it is a secret; use
    ``rediss://`` for TLS (``ssl_ca_certs`` to trust a private CA) and ``username`` /
    ``password`` (or ``password_file``) for AUTH and ACL users."""

    url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    url_file: Path | None = None
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    ssl_ca_certs: Path | None = None
    socket_timeout_s: float = Field(default=5.0, gt=0)
    cluster: bool = False
    """``url`` is a seed node of a Redis Cluster: each batch's keys go to the nodes that
    own their slots, one pipelined write per node, all sent before any reply is read."""

    def checked_url(self, source: str | None = None) -> str:
        """The URL, once it is known that redis-py reads it as written. Raises
        ``ConfigError`` naming the field and the fix, with no part of the URL in it."""
        url = self.url.get_secret_value()
        problem = redis_url_problem(url)
        if problem is None:
            return url
        field = "redis.url" if self.url_file is None else "redis.url (read from redis.url_file)"
        where = f"{source}: " if source else ""
        raise ConfigError(
            f"{where}{field}: cannot be used as written: {problem}. Percent-encode the user "
            "name and password in the URL (urllib.parse.quote(password, safe='')), or leave "
            "them out of it and set redis.username and redis.password or "
            "redis.password_file"
        ) from None


class BatchPolicy(_Frozen):
    """A batch closes at ``max_batch_size`` records or ``max_wait_ms`` after its first.

    ``adaptive`` adds a latency budget: a batch is handed over at once whenever the model
    is idle (so a lone request is not held for the window, and batches grow toward
    ``max_batch_size`` only while the model is busy), and its window shrinks so that
    records already ``age`` old when they arrive still close within
    ``latency_budget_ms`` of their Kafka timestamp.
    """

    max_batch_size: int = Field(default=256, ge=1, le=100_000)
    max_wait_ms: float = Field(default=20.0, ge=0, le=60_000)
    mode: Literal["fixed", "adaptive"] = "fixed"
    latency_budget_ms: float | None = Field(default=None, gt=0)


class FeatureSpec(_Frozen):
    """Which Redis hash holds an entity's features, which fields, and what a gap means."""

    key_template: str = "features:{entity}"
    fields: list[str] = Field(min_length=1)
    layout: Literal["hash", "packed"] = "hash"
    """hash: one Redis hash per entity, a field per feature (HMGET); packed: one string of
    little-endian float32 in ``fields`` order (MGET, decoded in one numpy call)."""
    on_missing_entity: MissingPolicy = "dead_letter"
    on_missing_field: MissingPolicy = "default"
    default_value: float = 0.0

    @model_validator(mode="after")
    def _template_names_entity(self) -> FeatureSpec:
        if "{entity}" not in self.key_template:
            raise ValueError("key_template must contain '{entity}'")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError("fields must not repeat")
        return self


class LookupSpec(FeatureSpec):
    """One feature lookup of a request: the entity id found at ``request.entities[name]``
    (default: a field called ``name``) names the key. Every lookup of a batch shares
    one Redis round trip."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")


_PATH = r"^[^.\s]+(\.[^.\s]+)*$"
"""A dotted path into a JSON request: ``meta.request_id``."""


class RequestMapping(_Frozen):
    """Where things are in a JSON request, as dotted paths.

    ``features`` holds inline values: an object ``name -> value``, or, with
    ``features_array``, an array of those features' values in that order. A feature that
    no lookup stores comes from the request alone; a request that lacks it follows
    ``on_missing_field``."""

    id: str = Field(default="id", pattern=_PATH)
    features: str = Field(default="features", pattern=_PATH)
    features_array: list[str] | None = Field(default=None, min_length=1)
    entities: dict[str, str] = Field(default_factory=dict)
    on_missing_field: MissingPolicy = "dead_letter"
    default_value: float = 0.0

    @model_validator(mode="after")
    def _paths_are_paths(self) -> RequestMapping:
        for name, path in self.entities.items():
            if not re.fullmatch(_PATH, path):
                raise ValueError(f"entities.{name}: {path!r} is not a dotted path")
        if self.features_array is not None and len(set(self.features_array)) != len(
            self.features_array
        ):
            raise ValueError("features_array must not repeat a name")
        return self


_HOOK = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class HooksSpec(_Frozen):
    """Python functions called once per batch, as ``package.module:function``: see
    ``worker.pipeline.hooks`` for their signatures."""

    prepare: str | None = Field(default=None, pattern=_HOOK)
    postprocess: str | None = Field(default=None, pattern=_HOOK)


class CudaOptions(_Frozen):
    """ONNX Runtime's CUDA provider, as ``[pipelines.model.cuda]``; also the device
    TensorRT runs on. See ``worker.inference.providers.provider_options`` for the option names."""

    device_id: int = Field(default=0, ge=0, le=255)
    cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = "EXHAUSTIVE"
    """How cuDNN picks convolution kernels: benchmarked once per shape (EXHAUSTIVE,
    Runtime's default), guessed (HEURISTIC) or fixed (DEFAULT)."""
    arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] = "kNextPowerOfTwo"
    """How the device memory arena grows; kSameAsRequested keeps several processes that
    share one device from each reserving powers of two."""
    gpu_mem_limit_mb: int | None = Field(default=None, ge=16)
    """The arena's ceiling in MiB (None: Runtime's default, no limit)."""


class TensorrtOptions(_Frozen):
    """ONNX Runtime's TensorRT provider, as ``[pipelines.model.tensorrt]``. Relative
    directories resolve against the config file's directory; each must be writable when
    TensorRT is among the providers (start-up fails naming it otherwise)."""

    fp16: bool = False
    engine_cache_dir: Path | None = None
    """Built engines are kept here (a volume) and reused at the next start of the same
    model, TensorRT version and GPU; None: an engine is built at every start."""
    timing_cache_dir: Path | None = None
    """TensorRT's kernel timings, which make the next build of any model faster."""
    max_workspace_mb: int | None = Field(default=None, ge=16)
    builder_optimization_level: int | None = Field(default=None, ge=0, le=5)


class ModelSpec(_Frozen):
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

    path: Path
    name: str = Field(min_length=1)
    version: str = "1"
    providers: list[Provider] = Field(default_factory=lambda: [_CPU])
    intra_op_threads: int = Field(default=1, ge=0, le=256)
    inputs: dict[str, list[str]] | None = None
    outputs: dict[str, str] | None = None
    class_names: list[str] | None = Field(default=None, min_length=1)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    cuda: CudaOptions = CudaOptions()
    tensorrt: TensorrtOptions = TensorrtOptions()
    deterministic: bool = True
    """False: the model may answer the same inputs differently (sampling, dropout left
    on, a random seed per run), so its outputs are never cached (``cache.enabled`` is
    refused)."""
    pad_to_buckets: bool | None = None
    """None: on when the serving provider is CUDA or TensorRT."""
    io_binding: bool | None = None
    """None: on when batches are padded and the serving provider is CUDA or TensorRT;
    models with string or map inputs or outputs are never bound."""
    watch: bool | None = None
    """Look for a new model every ``reload_poll_s`` and serve it without a restart
    (``worker.models.reloader``). None: on when ``path`` is a directory of versions, off for a
    file (which SIGHUP or ``POST /reload`` still make the worker look at)."""
    reload_poll_s: float = Field(default=3.0, gt=0, le=3600)
    version_dir: Path | None = None
    """Set when the config is loaded, never written: the directory of numbered versions
    that ``path`` named, when the worker follows its highest version (``path`` then
    names that version's model.onnx, and ``version`` its name)."""

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


class CacheSpec(_Frozen):
    """The output cache (``worker.cache.output_cache``): a row whose model inputs were seen
    before gets the outputs computed then, without the model. ``max_entries`` rows are
    kept in process (least recently used first out; 0: none); with ``redis_ttl_s`` they
    are also shared through the worker's Redis for that many seconds, under
    ``redis_key_prefix``, so other workers and restarts find them. The Redis tier is an
    optimisation: a round trip that fails or takes over ``redis_timeout_ms`` counts as
    misses, and the tier rests for a while, without holding the batch up."""

    enabled: bool = False
    max_entries: int = Field(default=100_000, ge=0, le=100_000_000)
    redis_ttl_s: int | None = Field(default=None, ge=1, le=365 * 86_400)
    redis_key_prefix: str = Field(default="streamfer:cache:", min_length=1, max_length=200)
    redis_timeout_ms: float = Field(default=250.0, gt=0, le=60_000)


class CandidateSpec(_Frozen):
    """Another model run beside a pipeline's own, on the same features: a file, or a
    directory of versions (its highest, or ``version``). It is loaded, checked and warmed
    like the pipeline's model, whose other settings (providers, inputs, outputs ...) it
    shares, and must feed exactly like it. Its results name ``name`` (default: the
    pipeline model's) and ``version`` (for a file, required)."""

    model: Path
    version: str | None = None
    name: str | None = Field(default=None, min_length=1)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")

    def model_spec(self, primary: ModelSpec) -> ModelSpec:
        """The candidate as a ``ModelSpec`` (once the config is loaded: ``model`` names a
        file and ``version`` is set)."""
        return primary.model_copy(
            update={
                "path": self.model,
                "version": self.version or primary.version,
                "name": self.name or primary.name,
                "sha256": self.sha256,
                "version_dir": None,
                "watch": False,
            }
        )


class CanarySpec(CandidateSpec):
    """``[pipelines.canary]``: the records whose key hashes into the first ``percent`` of
    10,000 buckets (``worker.pipeline.canary``) are scored by this model instead, and their
    results, published like the others, name it."""

    percent: float = Field(gt=0, le=100)


class ShadowSpec(CandidateSpec):
    """``[pipelines.shadow]``: this model also scores a copy of every batch, after the
    pipeline's model, on a thread of its own (``worker.pipeline.shadow``); its results go to
    ``topic``. The pipeline's publish waits at most ``max_delay_ms`` for room among the
    ``queue_batches`` waiting for it; a batch that finds none is dropped for the shadow
    and counted. Agreement with the pipeline's model is measured over about the last
    ``agreement_rows`` rows."""

    topic: str = Field(min_length=1)
    queue_batches: int = Field(default=8, ge=1, le=1024)
    max_delay_ms: float = Field(default=0.0, ge=0, le=10_000)
    agreement_rows: int = Field(default=10_000, ge=1, le=100_000_000)


class PipelineConfig(_Frozen):
    """Request topics → features → model → result topic, with its own batch policy.

    ``features`` (one lookup, its entity id in the request's ``entity`` field) is the
    short form of ``lookups`` and becomes a lookup named ``entity``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    request_topics: list[str] = Field(min_length=1)
    result_topic: str = Field(min_length=1)
    dead_letter_topic: str = Field(min_length=1)
    request: RequestMapping = RequestMapping()
    features: FeatureSpec | None = None
    lookups: list[LookupSpec] = Field(default_factory=list)
    model: ModelSpec
    canary: CanarySpec | None = None
    shadow: ShadowSpec | None = None
    hooks: HooksSpec = HooksSpec()
    cache: CacheSpec = CacheSpec()
    batch: BatchPolicy = BatchPolicy()
    max_record_bytes: int = Field(default=1_048_576, ge=64)
    source_headers: bool = True
    """Results carry ``streamfer.request_id`` and ``streamfer.source_*`` headers. Off,
    only a request's ``traceparent`` is copied: each header costs the producer about a
    microsecond per record, and the body already holds the id and request time."""
    priority: Priority = "normal"
    """Where this pipeline's batches queue for each processing stage: a stage takes the
    next batch of the highest priority waiting (``worker.loop.lanes``), first in, first out
    within a priority. All pipelines alike (the default): one queue, as it comes."""
    max_in_flight_share: float | None = Field(default=None, gt=0, le=1)
    """The most of the worker's in-flight bound this pipeline's records may hold; beyond
    it only this pipeline's partitions pause. None: ``bulk_in_flight_share`` when another
    pipeline has a higher priority, no share of its own otherwise."""

    @property
    def rank(self) -> int:
        """``priority`` as an integer: higher goes first."""
        p = self.priority
        return PRIORITY_NAMES[p] if isinstance(p, str) else p

    @model_validator(mode="before")
    @classmethod
    def _features_is_one_lookup(cls, data: Any) -> Any:
        """``features`` becomes the lookup ``entity`` (when it is valid: otherwise its
        own errors, under ``features``, say what to fix)."""
        if not isinstance(data, dict) or data.get("features") is None:
            return data
        features = data["features"]
        try:
            spec = (
                features
                if isinstance(features, FeatureSpec)
                else FeatureSpec.model_validate(features)
            )
        except ValidationError:
            return data
        one = LookupSpec(name="entity", **spec.model_dump())
        given = data.get("lookups")
        if given:
            same = [
                g if isinstance(g, LookupSpec) else LookupSpec.model_validate(g) for g in given
            ] == [one]
            if not same:
                raise ValueError("give either features or lookups, not both")
        return {**data, "lookups": [one]}

    @model_validator(mode="after")
    def _lookups_are_unambiguous(self) -> PipelineConfig:
        names = [lookup.name for lookup in self.lookups]
        if len(set(names)) != len(names):
            raise ValueError(f"lookup names must be unique, got {names}")
        unknown = sorted(set(self.request.entities) - set(names))
        if unknown:
            raise ValueError(f"request.entities names {unknown}, which are not lookups {names}")
        _owners(((lk.name, lk.fields) for lk in self.lookups), "feature", "lookups")
        if self.shadow is not None and self.shadow.topic in (
            self.result_topic,
            self.dead_letter_topic,
        ):
            raise ValueError(
                f"shadow.topic {self.shadow.topic!r} must differ from result_topic and "
                "dead_letter_topic"
            )
        if not self.lookups and self.model.inputs is None and self.request.features_array is None:
            raise ValueError(
                "no lookups and no model.inputs: name the features (lookups, "
                "request.features_array or model.inputs)"
            )
        return self

    @model_validator(mode="after")
    def _cache_is_sound(self) -> PipelineConfig:
        cache = self.cache
        if not cache.enabled:
            return self
        if not self.model.deterministic:
            raise ValueError(
                "cache.enabled = true but model.deterministic = false: a model that may "
                "answer the same inputs differently cannot have its outputs cached"
            )
        hooks = [name for name in ("prepare", "postprocess") if getattr(self.hooks, name)]
        if hooks:
            raise ValueError(
                f"cache.enabled = true with hooks.{' and hooks.'.join(hooks)}: hooks see the "
                "whole request, so the model's inputs alone do not decide a result; turn "
                "one of them off"
            )
        beside = [name for name in ("canary", "shadow") if getattr(self, name) is not None]
        if beside:
            raise ValueError(
                f"cache.enabled = true with a {' and a '.join(beside)}: their results are "
                "published and compared per model, the cache's per input; turn one off"
            )
        if cache.max_entries == 0 and cache.redis_ttl_s is None:
            raise ValueError(
                "cache.enabled = true with cache.max_entries = 0 and no cache.redis_ttl_s: "
                "the cache has nowhere to keep anything"
            )
        return self

    def entity_path(self, lookup: str) -> str:
        """Where the request holds the entity id of ``lookup``."""
        return self.request.entities.get(lookup, lookup)

    def stored_fields(self) -> list[str]:
        """Every feature the lookups store, lookup by lookup."""
        return [field for lookup in self.lookups for field in lookup.fields]


def _owners(groups: Iterable[tuple[str, Iterable[str]]], what: str, kind: str) -> dict[str, str]:
    """Member -> the group that has it; a member in two groups is a ValueError."""
    owner: dict[str, str] = {}
    for name, members in groups:
        for member in members:
            if member in owner:
                raise ValueError(f"{what} {member!r} is in {kind} {owner[member]!r} and {name!r}")
            owner[member] = name
    return owner


class MetricsSettings(_Frozen):
    """The Prometheus endpoint; off unless a port is given. ``reload_endpoint`` adds
    ``POST /reload`` (look for a new model now), for a loopback ``host`` only."""

    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    reload_endpoint: bool = False

    @model_validator(mode="after")
    def _reload_only_on_loopback(self) -> MetricsSettings:
        if self.reload_endpoint and not is_loopback(self.host):
            raise ValueError(
                f"reload_endpoint = true needs a loopback host (127.0.0.1, ::1 or "
                f"localhost), not {self.host!r}: anyone who reaches the port could make "
                "the worker load models; send SIGHUP instead"
            )
        return self


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is only reachable from this host."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WorkerConfig(_Frozen):
    """Everything one worker process needs; several pipelines may share it."""

    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    pipelines: list[PipelineConfig] = Field(min_length=1)
    delivery: Literal["at-least-once", "exactly-once"] = "at-least-once"
    transaction_interval_ms: float = Field(default=100.0, ge=0, le=60_000)
    """exactly-once: batches waiting behind each other share one transaction this long."""
    exactly_once_probe: bool = True
    """exactly-once: prove at start-up that the broker hides aborted records from
    read_committed readers, on ``exactly_once_probe_topic``. False skips it (a warning)."""
    exactly_once_probe_topic: str = Field(
        default="__streamfer_transaction_probe", min_length=1, max_length=249
    )
    """Created (one partition, the cluster's default replication) when missing; where the
    worker's user may not create topics, create it beforehand and allow it to use it."""
    max_in_flight_batches: int = Field(default=4, ge=1, le=1024)
    """Records produced but not yet committed stay under this many full batches' worth
    (x max_batch_size); beyond it the loop waits, then pauses its partitions."""
    bulk_in_flight_share: float = Field(default=0.5, gt=0, le=1)
    """The share of the in-flight bound a pipeline may hold while another pipeline of
    this worker has a higher priority (its own ``max_in_flight_share`` overrides it):
    room kept for the latency-sensitive pipeline's records."""
    max_overtaken_ms: float = Field(default=500.0, gt=0, le=600_000)
    """A batch that higher-priority batches have overtaken at one stage for this long
    goes next there: under a sustained overload of the higher priority, lower ones still
    get one batch through per stage this often."""
    poll_timeout_ms: float = Field(default=100.0, gt=0, le=10_000)
    shutdown_timeout_s: float = Field(default=30.0, gt=0)
    revoke_timeout_s: float = Field(default=10.0, gt=0)
    feature_store_retry_s: float | None = Field(default=None, gt=0)
    """How long one batch waits for an unreachable feature store; None: until it is back."""
    statistics_interval_ms: int = Field(default=5000, ge=0)
    liveness_timeout_s: float = Field(default=60.0, gt=0)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    metrics: MetricsSettings = MetricsSettings()

    @model_validator(mode="after")
    def _topics_are_unambiguous(self) -> WorkerConfig:
        names = [p.name for p in self.pipelines]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline names must be unique, got {names}")
        owner = _owners(
            ((p.name, p.request_topics) for p in self.pipelines), "request topic", "pipelines"
        )
        for p in self.pipelines:
            shadow = [p.shadow.topic] if p.shadow is not None else []
            for out in (p.result_topic, p.dead_letter_topic, *shadow):
                if out in owner:
                    raise ValueError(f"output topic {out!r} of {p.name!r} is also a request topic")
        return self

    @model_validator(mode="after")
    def _shares_hold_a_batch(self) -> WorkerConfig:
        bound = self.in_flight_bound
        for i, p in enumerate(self.pipelines):
            share = self.in_flight_share(p)
            if share is None or share * bound >= p.batch.max_batch_size:
                continue
            field = (
                f"pipelines[{i}].max_in_flight_share"
                if p.max_in_flight_share is not None
                else f"bulk_in_flight_share (which applies to pipelines[{i}], {p.name!r})"
            )
            raise ValueError(
                f"{field}: {share:g} of the in-flight bound ({bound} records: "
                f"max_in_flight_batches x the largest max_batch_size) is "
                f"{int(share * bound)} records, less than one batch of {p.name!r} "
                f"(max_batch_size {p.batch.max_batch_size}); raise the share or "
                "max_in_flight_batches, or lower that max_batch_size"
            )
        return self

    @property
    def in_flight_bound(self) -> int:
        """Records in flight at which every owned partition pauses."""
        return self.max_in_flight_batches * max(p.batch.max_batch_size for p in self.pipelines)

    def in_flight_share(self, pipeline: PipelineConfig) -> float | None:
        """The share of ``in_flight_bound`` the pipeline may hold, or None for no limit of
        its own: its ``max_in_flight_share``, else ``bulk_in_flight_share`` when another
        pipeline has a higher priority."""
        if pipeline.max_in_flight_share is not None:
            return pipeline.max_in_flight_share
        top = max(p.rank for p in self.pipelines)
        return self.bulk_in_flight_share if pipeline.rank < top else None

    def pipeline(self, name: str) -> PipelineConfig:
        """The pipeline called ``name``. Raises ``ConfigError`` listing those there are."""
        for p in self.pipelines:
            if p.name == name:
                return p
        names = [p.name for p in self.pipelines]
        raise ConfigError(f"no pipeline {name!r}; the config has {names}")

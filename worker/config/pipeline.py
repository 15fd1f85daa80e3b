"""One pipeline: request topics -> features -> model -> result topic, with its batch
policy, hooks, output cache and priority, and the rules that tie its parts together (a
cache needs a deterministic model and no hooks, a shadow its own topic, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError, model_validator

from worker.config.base import Frozen, owners
from worker.config.candidates import CanarySpec, ShadowSpec
from worker.config.inputs import FeatureSpec, LookupSpec, RequestMapping
from worker.config.model_spec import ModelSpec
from worker.config.steps import StepSpec, check_steps, graph_model

__all__ = [
    "PRIORITY_NAMES",
    "BatchPolicy",
    "CacheSpec",
    "HooksSpec",
    "PipelineConfig",
    "Priority",
    "RequestFormat",
]


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

RequestFormat = Literal["json", "avro", "protobuf", "json-schema"]
"""How a pipeline's request values are written (``PipelineConfig.request_format``)."""


class BatchPolicy(Frozen):
    """A batch closes at ``max_batch_size`` records or ``max_wait_ms`` after its first.

    ``adaptive`` adds a latency budget: a batch is handed over at once whenever the model
    is idle (so a lone request is not held for the window, and batches grow toward
    ``max_batch_size`` only while the model is busy), and its window shrinks so that
    records already ``age`` old when they arrive still close within
    ``latency_budget_ms`` of their Kafka timestamp.
    """

    max_batch_size: int = Field(
        default=256, ge=1, le=100_000, description="A batch is handed over at this many records."
    )
    max_wait_ms: float = Field(
        default=10.0,
        ge=0,
        le=60_000,
        description="... or this long after its first record, whichever comes first.",
    )
    mode: Literal["fixed", "adaptive"] = Field(
        default="fixed",
        description=(
            "fixed: wait for the window; adaptive: hand a batch over at once when "
            "the model is idle, and shrink the window by the records' age."
        ),
    )
    latency_budget_ms: float | None = Field(
        default=None,
        gt=0,
        description=("adaptive mode: the age a record may reach before its batch is handed over."),
    )


_HOOK = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
_STEPS = TypeAdapter(list[StepSpec])


class HooksSpec(Frozen):
    """Python functions called once per batch, as ``package.module:function``: see
    ``worker.pipeline.hooks`` for their signatures."""

    prepare: str | None = Field(
        default=None,
        pattern=_HOOK,
        description=(
            "package.module:function called once per batch before the model, with "
            "the requests and the model inputs; returns the inputs to run."
        ),
    )
    postprocess: str | None = Field(
        default=None,
        pattern=_HOOK,
        description=(
            "package.module:function called once per batch after the model, with "
            "the requests and outputs; returns the outputs to publish."
        ),
    )


class CacheSpec(Frozen):
    """The output cache (``worker.cache.output_cache``): a row whose model inputs were seen
    before gets the outputs computed then, without the model. Up to ``max_entries`` rows
    taking up to ``max_bytes`` are kept in process (least recently used first out, once
    either bound is passed; a row larger than ``max_bytes`` alone is not kept; 0: none),
    and a reload drops the previous model's. With ``redis_ttl_s`` they are also shared
    through the worker's Redis for that many seconds, under ``redis_key_prefix``, so
    other workers and restarts find them. The Redis tier is an optimisation: a round
    trip that fails or takes over ``redis_timeout_ms`` counts as misses, and the tier
    rests for a while, without holding the batch up."""

    enabled: bool = Field(
        default=False,
        description=(
            "Answer rows whose model inputs were seen before from the cache, without the model."
        ),
    )
    max_entries: int = Field(
        default=100_000,
        ge=0,
        le=100_000_000,
        description="Rows kept in the worker process, least recently used out (0: none).",
    )
    max_bytes: int = Field(
        default=256 * 2**20,
        ge=0,
        le=2**40,
        description=(
            "What the in-process entries may take, counted as keys and values plus "
            "about 176 bytes each (`worker.cache.memory`); 256 MiB holds about "
            "17,000 rows of 768 floats."
        ),
    )
    redis_ttl_s: int | None = Field(
        default=None,
        ge=1,
        le=365 * 86_400,
        description=(
            "Also share rows through [redis], each kept this many seconds; None: in-process only."
        ),
    )
    redis_key_prefix: str = Field(
        default="streamfer:cache:",
        min_length=1,
        max_length=200,
        description="The prefix of the cache's Redis keys.",
    )
    redis_timeout_ms: float = Field(
        default=250.0,
        gt=0,
        le=60_000,
        description=(
            "A slower Redis cache round trip counts as misses; the batch never waits for it."
        ),
    )


class PipelineConfig(Frozen):
    """Request topics → features → model → result topic, with its own batch policy.

    ``features`` (one lookup, its entity id in the request's ``entity`` field) is the
    short form of ``lookups`` and becomes a lookup named ``entity``."""

    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The pipeline's name, in results, metrics and log lines.",
    )
    request_topics: list[str] = Field(
        min_length=1, description="The topics this pipeline consumes requests from."
    )
    result_topic: str = Field(min_length=1, description="Where one result per request goes.")
    dead_letter_topic: str = Field(
        min_length=1,
        description="Where each refused request goes, with its stage, code and reason.",
    )
    request: RequestMapping = Field(
        default=RequestMapping(),
        description="Where the id, inline features and entity ids are in a request.",
    )
    features: FeatureSpec | None = Field(
        default=None,
        description=(
            "The single lookup of the default request shape (its entity id in the "
            "request's entity field)."
        ),
    )
    lookups: list[LookupSpec] = Field(
        default_factory=list,
        description="Several named Redis lookups, all fetched in one round trip per batch.",
    )
    model: ModelSpec = Field(
        description=(
            "The ONNX model and how its inputs are fed; with steps, set from them "
            "(`worker.config.steps.graph_model`)."
        )
    )
    steps: list[StepSpec] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Several models run on each batch in order, instead of [pipelines.model]; "
            "each step's inputs come from features, request fields or earlier steps' "
            "outputs, and results carry the last step's outputs (and those a step "
            "publishes)."
        ),
    )
    canary: CanarySpec | None = Field(
        default=None,
        description=(
            "A candidate model that scores a share of the records, published like the others."
        ),
    )
    shadow: ShadowSpec | None = Field(
        default=None,
        description=("A candidate model that scores a copy of every batch to a topic of its own."),
    )
    hooks: HooksSpec = Field(
        default=HooksSpec(), description="Python functions called once per batch around the model."
    )
    cache: CacheSpec = Field(
        default=CacheSpec(),
        description=(
            "The output cache: rows with inputs seen before are answered without the model."
        ),
    )
    batch: BatchPolicy = Field(
        default=BatchPolicy(), description="How records are grouped into batches."
    )
    max_record_bytes: int = Field(
        default=1_048_576,
        ge=64,
        description=(
            "A request value larger than this is dead-lettered (oversized) before it is parsed."
        ),
    )
    pause_after_model_failures: int = Field(
        default=3,
        ge=1,
        le=1_000,
        description=(
            "Before the model has answered any row: how many batches in a row it "
            "may refuse every row of (each dead-lettered) before the pipeline takes"
            " it for a fault of the model and waits instead. Once it has answered a"
            " row, a refused batch is tested on that row and waits at once "
            "(`worker.pipeline.model_faults`)."
        ),
    )
    request_format: RequestFormat = Field(
        default="json",
        description=(
            "How request values are written: JSON, or Avro, Protobuf or JSON Schema"
            " records framed for a Schema Registry (`[schema_registry]`), read with"
            " their writer's schema (`worker.registry`)."
        ),
    )
    request_protobuf: str | None = Field(
        default=None,
        pattern=_HOOK,
        description=(
            'With `request_format = "protobuf"`: the generated message class the '
            "requests are, `package.module:Message`."
        ),
    )
    result_format: Literal["json", "avro"] = Field(
        default="json",
        description=(
            "How results are written: JSON, or Avro framed for the Schema Registry "
            "(the same fields; `worker.registry.avro_results`). Dead letters stay "
            "JSON."
        ),
    )
    result_schema: Path | None = Field(
        default=None,
        description=(
            'With `result_format = "avro"`: the result\'s Avro schema (an `.avsc` '
            "file); None derives it from the model's outputs."
        ),
    )
    auto_register: bool = Field(
        default=False,
        description=(
            'With `result_format = "avro"`: register the result schema under its '
            "subject at start-up; otherwise it must be registered there already."
        ),
    )
    result_subject_strategy: Literal["topic", "record", "topic_record"] = Field(
        default="topic",
        description=(
            "The result schema's subject: `<result_topic>-value` (topic), the "
            "record's full name (record) or both (topic_record)."
        ),
    )
    source_headers: bool = Field(
        default=True,
        description=(
            "Results carry `streamfer.request_id` and `streamfer.source_*` headers."
            " Off, only a request's `traceparent` is copied: each header costs the "
            "producer about a microsecond per record, and the body already holds "
            "the id and request time."
        ),
    )
    result_details: bool = Field(
        default=False,
        description=(
            "JSON results also carry their batch's per-stage `timings_ms` and the "
            "model's `sha256` digest. Off, a result keeps `id`, `key`, `outputs`, the "
            "model's name and version, `pipeline` and `request_ts_ms`: about half the "
            "bytes, and the same figures are in the stage histograms. Avro results and "
            "shadow results always carry both."
        ),
    )
    priority: Priority = Field(
        default="normal",
        description=(
            "Where this pipeline's batches queue for each processing stage: a stage"
            " takes the next batch of the highest priority waiting "
            "(`worker.loop.lanes`), first in, first out within a priority. All "
            "pipelines alike (the default): one queue, as it comes."
        ),
    )
    max_in_flight_share: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "The most of the worker's in-flight bound this pipeline's records may "
            "hold; beyond it only this pipeline's partitions pause. None: "
            "`bulk_in_flight_share` when another pipeline has a higher priority, no"
            " share of its own otherwise."
        ),
    )

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

    @model_validator(mode="before")
    @classmethod
    def _steps_are_the_model(cls, data: Any) -> Any:
        """A pipeline of ``steps`` serves them as one model (``graph_model``); its own
        errors, under ``steps``, say what to fix when they are not valid."""
        if not isinstance(data, dict) or data.get("steps") is None:
            return data
        if data.get("model") is not None:
            raise ValueError("give either model or steps, not both")
        try:
            steps = _STEPS.validate_python(data["steps"])
        except ValidationError:
            steps = []
        # invalid steps are reported under steps; model has nothing to add to that
        stand_in = {"name": "steps", "path": "steps"}
        return {**data, "model": graph_model(steps) if steps else stand_in}

    @model_validator(mode="after")
    def _steps_are_a_graph(self) -> PipelineConfig:
        if self.steps is None:
            return self
        check_steps(self.steps)
        beside = [name for name in ("canary", "shadow") if getattr(self, name) is not None]
        if beside:
            raise ValueError(
                f"steps with a {' and a '.join(beside)}: a candidate stands in for one "
                "model, not a graph; turn it off"
            )
        return self

    @model_validator(mode="after")
    def _lookups_are_unambiguous(self) -> PipelineConfig:
        names = [lookup.name for lookup in self.lookups]
        if len(set(names)) != len(names):
            raise ValueError(f"lookup names must be unique, got {names}")
        unknown = sorted(set(self.request.entities) - set(names))
        if unknown:
            raise ValueError(f"request.entities names {unknown}, which are not lookups {names}")
        owners(((lk.name, lk.fields) for lk in self.lookups), "feature", "lookups")
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
    def _protobuf_has_its_class(self) -> PipelineConfig:
        if self.request_format == "protobuf" and self.request_protobuf is None:
            raise ValueError(
                'request_format = "protobuf" needs request_protobuf = "package.module:Message", '
                "the generated class of the request message"
            )
        if self.request_format != "protobuf" and self.request_protobuf is not None:
            raise ValueError(
                f'request_protobuf is for request_format = "protobuf" (this pipeline reads '
                f"{self.request_format})"
            )
        return self

    @model_validator(mode="after")
    def _avro_results_are_sound(self) -> PipelineConfig:
        if self.result_format == "json":
            given = [
                name
                for name, default in (
                    ("result_schema", None),
                    ("auto_register", False),
                    ("result_subject_strategy", "topic"),
                )
                if getattr(self, name) != default
            ]
            if given:
                raise ValueError(f'{", ".join(given)}: for result_format = "avro" only')
            return self
        if self.cache.enabled:
            raise ValueError(
                'result_format = "avro" with cache.enabled = true: the cache keeps results '
                "as JSON; turn one of them off"
            )
        if self.hooks.postprocess is not None and self.result_schema is None:
            raise ValueError(
                'result_format = "avro" with hooks.postprocess needs result_schema: the '
                "hook decides the outputs, so they cannot be derived from the model's"
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
        bound = next((b for b in ("max_entries", "max_bytes") if not getattr(cache, b)), None)
        if bound is not None and cache.redis_ttl_s is None:
            raise ValueError(
                f"cache.enabled = true with cache.{bound} = 0 and no cache.redis_ttl_s: "
                "the cache has nowhere to keep anything"
            )
        return self

    def entity_path(self, lookup: str) -> str:
        """Where the request holds the entity id of ``lookup``."""
        return self.request.entities.get(lookup, lookup)

    def stored_fields(self) -> list[str]:
        """Every feature the lookups store, lookup by lookup."""
        return [field for lookup in self.lookups for field in lookup.fields]

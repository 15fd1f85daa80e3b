"""The worker's configuration. The typed schema, a module per concept: the settings
models' shared base (``base``), the Kafka and Redis connections (``connections``), a
pipeline's inputs (``inputs``), its model and execution providers (``model_spec``), the
canary and shadow models (``candidates``), the pipeline itself (``pipeline``) and the
whole worker (``worker_config``). Beside it: loading with environment overrides
(``loading``), redaction (``redaction``), Redis URL checks (``redis_url``), and what the
file system resolves (``resolution``, ``model_versions``), kept out of the schema.

Every value is validated at start-up; a bad one raises ``ConfigError`` whose message names
the field. Secrets are ``SecretStr`` and never print, and no error message quotes one.
"""

from worker.config.candidates import (
    CANARY_BUCKETS,
    CanarySpec,
    CandidateSpec,
    ShadowSpec,
    canary_buckets,
)
from worker.config.connections import KafkaSettings, RedisSettings
from worker.config.inputs import FeatureSpec, LookupSpec, MissingPolicy, RequestMapping
from worker.config.loading import ENV_PREFIX, load_config, parse_config
from worker.config.model_spec import CudaOptions, ModelSpec, TensorrtOptions, TritonSettings
from worker.config.model_versions import list_versions
from worker.config.pipeline import (
    PRIORITY_NAMES,
    BatchPolicy,
    CacheSpec,
    HooksSpec,
    PipelineConfig,
    Priority,
    RequestFormat,
)
from worker.config.redaction import LIBRDKAFKA_SECRET_OPTIONS, redacted
from worker.config.redis_url import redis_url_problem
from worker.config.schema_registry import SchemaRegistrySettings
from worker.config.steps import StepSpec, check_steps, graph_model, step_reference
from worker.config.targets import import_target
from worker.config.worker_config import MetricsSettings, WorkerConfig, is_loopback

__all__ = [
    "CANARY_BUCKETS",
    "ENV_PREFIX",
    "LIBRDKAFKA_SECRET_OPTIONS",
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
    "RequestFormat",
    "RequestMapping",
    "SchemaRegistrySettings",
    "ShadowSpec",
    "StepSpec",
    "TensorrtOptions",
    "TritonSettings",
    "WorkerConfig",
    "canary_buckets",
    "check_steps",
    "graph_model",
    "import_target",
    "is_loopback",
    "list_versions",
    "load_config",
    "parse_config",
    "redacted",
    "redis_url_problem",
    "step_reference",
]

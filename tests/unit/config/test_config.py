"""Configuration: TOML + STREAMFER_ overrides, validated, with errors that name the field."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from worker.config import (
    BatchPolicy,
    FeatureSpec,
    WorkerConfig,
    canary_buckets,
    load_config,
    parse_config,
)
from worker.errors import ConfigError

VALID_TOML = """
log_format = "json"

[kafka]
bootstrap_servers = "broker-1:9092,broker-2:9092"
group_id = "scorers"
auto_offset_reset = "latest"

[kafka.options]
"security.protocol" = "SASL_SSL"

[redis]
url = "redis://:hunter2@redis.internal:6379/0"

[[pipelines]]
name = "fraud"
request_topics = ["fraud.requests"]
result_topic = "fraud.results"
dead_letter_topic = "fraud.dead"

[pipelines.features]
fields = ["f0", "f1", "f2"]
on_missing_entity = "default"
default_value = -1.0

[pipelines.model]
path = "models/m.onnx"
name = "fraud-rf"
version = "7"

[pipelines.batch]
max_batch_size = 64
max_wait_ms = 10
"""


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """Config only checks that the model file exists; an empty one will do."""
    path = tmp_path / "models" / "m.onnx"
    path.parent.mkdir()
    path.write_bytes(b"")
    return path


@pytest.fixture
def config_file(tmp_path: Path, model_file: Path) -> Path:
    path = tmp_path / "streamfer.toml"
    path.write_text(VALID_TOML)
    return path


Raw = dict[str, Any]


@pytest.fixture
def make_raw(model_file: Path) -> Callable[..., Raw]:
    """A minimal valid config mapping; keyword arguments replace pipeline fields."""

    def make(**pipeline: Any) -> Raw:
        base: Raw = {
            "name": "p",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "features": {"fields": ["a", "b"]},
            "model": {"path": str(model_file), "name": "m"},
        }
        base.update(pipeline)
        return {"pipelines": [base]}

    return make


def config_error(raw: Raw, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ=environ or {})
    return str(info.value)


# --- loading a valid file ------------------------------------------------------------


def test_load_valid_toml(config_file: Path, model_file: Path) -> None:
    cfg = load_config(config_file, environ={})
    assert isinstance(cfg, WorkerConfig)
    assert cfg.log_format == "json"
    assert cfg.kafka.bootstrap_servers == "broker-1:9092,broker-2:9092"
    assert cfg.kafka.group_id == "scorers"
    assert cfg.kafka.auto_offset_reset == "latest"
    assert cfg.kafka.options == {"security.protocol": "SASL_SSL"}
    assert cfg.redis.url.get_secret_value() == "redis://:hunter2@redis.internal:6379/0"
    (p,) = cfg.pipelines
    assert p.name == "fraud"
    assert p.request_topics == ["fraud.requests"]
    assert p.features.fields == ["f0", "f1", "f2"]
    assert p.features.on_missing_entity == "default"
    assert p.features.on_missing_field == "default"
    assert p.features.default_value == -1.0
    assert p.model.version == "7"
    assert p.model.providers == ["CPUExecutionProvider"]
    assert p.batch == BatchPolicy(max_batch_size=64, max_wait_ms=10)
    # the relative model path resolves against the config file's folder
    assert p.model.path == model_file
    assert p.model.path.is_absolute()


def test_defaults(make_raw: Callable[..., Raw]) -> None:
    cfg = parse_config(make_raw(), environ={})
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka.auto_offset_reset == "earliest"
    assert cfg.kafka.heartbeat_interval_ms == 1000
    assert cfg.max_in_flight_batches == 4
    assert cfg.metrics.port is None
    p = cfg.pipelines[0]
    assert p.batch.max_batch_size == 256
    assert p.batch.max_wait_ms == 10.0
    assert p.max_record_bytes == 1_048_576
    assert p.features.key_template == "features:{entity}"
    assert p.features.on_missing_entity == "dead_letter"


def test_config_is_frozen(make_raw: Callable[..., Raw]) -> None:
    cfg = parse_config(make_raw(), environ={})
    with pytest.raises(ValidationError):
        cfg.pipelines[0].batch.max_batch_size = 5  # type: ignore[misc]


def test_parse_does_not_mutate_its_input(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    before = copy.deepcopy(raw)
    parse_config(raw, environ={"STREAMFER_PIPELINES__0__BATCH__MAX_WAIT_MS": "5"})
    assert raw == before


def test_secret_redis_url_is_not_printed(config_file: Path) -> None:
    cfg = load_config(config_file, environ={})
    for text in (repr(cfg), str(cfg), repr(cfg.redis), str(cfg.redis.url), cfg.model_dump_json()):
        assert "hunter2" not in text
    assert "**********" in repr(cfg.redis)


# --- errors name the field -----------------------------------------------------------


def test_error_names_nested_field(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(batch={"max_batch_size": 0}))
    assert "pipelines[0].batch.max_batch_size" in msg
    assert "greater than or equal to 1" in msg


def test_heartbeat_must_be_shorter_than_the_session(make_raw: Callable[..., Raw]) -> None:
    raw = {**make_raw(), "kafka": {"session_timeout_ms": 1000, "heartbeat_interval_ms": 1000}}
    msg = config_error(raw)
    assert "heartbeat_interval_ms (1000) must be less than session_timeout_ms (1000)" in msg


def test_error_names_second_pipeline_index(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    second = {**raw["pipelines"][0], "name": "q", "request_topics": ["req2"]}
    second["batch"] = {"max_wait_ms": -1}
    raw["pipelines"].append(second)
    msg = config_error(raw)
    assert "pipelines[1].batch.max_wait_ms" in msg


def test_literal_error_lists_allowed_values(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    raw["kafka"] = {"auto_offset_reset": "sometimes"}
    msg = config_error(raw)
    assert "kafka.auto_offset_reset" in msg
    for allowed in ("'earliest'", "'latest'", "'error'"):
        assert allowed in msg


def test_unknown_provider_lists_allowed_values(
    make_raw: Callable[..., Raw], model_file: Path
) -> None:
    msg = config_error(make_raw(model={"path": str(model_file), "name": "m", "providers": ["TPU"]}))
    assert "pipelines[0].model.providers[0]" in msg
    assert "'CPUExecutionProvider'" in msg


@pytest.mark.parametrize(
    ("where", "extra"),
    [("kafka", {"bootstrap": "x"}), ("top", {"pipelinez": []})],
)
def test_unknown_field_is_rejected(
    make_raw: Callable[..., Raw], where: str, extra: dict[str, Any]
) -> None:
    raw = make_raw()
    if where == "top":
        raw.update(extra)
    else:
        raw[where] = extra
    msg = config_error(raw)
    name = next(iter(extra))
    assert name in msg
    assert "Extra inputs are not permitted" in msg


def test_unknown_pipeline_field_names_its_path(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(batch={"max_batch": 5}))
    assert "pipelines[0].batch.max_batch" in msg


def test_missing_required_field(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    del raw["pipelines"][0]["result_topic"]
    msg = config_error(raw)
    assert "pipelines[0].result_topic" in msg
    assert "Field required" in msg


def test_no_pipelines() -> None:
    assert "pipelines" in config_error({"pipelines": []})
    assert "pipelines: Field required" in config_error({})


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        ({"fields": []}, "pipelines[0].features.fields"),
        ({"fields": ["a", "a"]}, "fields must not repeat"),
        ({"fields": ["a"], "key_template": "features:x"}, "must contain '{entity}'"),
        ({"fields": ["a"], "on_missing_field": "ignore"}, "'default' or 'dead_letter'"),
    ],
)
def test_feature_spec_errors(
    make_raw: Callable[..., Raw], features: dict[str, Any], expected: str
) -> None:
    msg = config_error(make_raw(features=features))
    assert expected in msg
    assert "pipelines[0].features" in msg


def test_bad_sha256_pin(make_raw: Callable[..., Raw], model_file: Path) -> None:
    msg = config_error(make_raw(model={"path": str(model_file), "name": "m", "sha256": "abc"}))
    assert "pipelines[0].model.sha256" in msg


def test_bad_pipeline_name(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(name="has space"))
    assert "pipelines[0].name" in msg


def test_missing_model_file_names_field(make_raw: Callable[..., Raw], tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    msg = config_error(make_raw(model={"path": str(missing), "name": "m"}))
    assert "pipelines[0].model.path" in msg
    assert str(missing) in msg


def test_model_path_is_a_directory_without_versions(
    make_raw: Callable[..., Raw], tmp_path: Path
) -> None:
    msg = config_error(make_raw(model={"path": str(tmp_path), "name": "m"}))
    assert "pipelines[0].model.path" in msg and "holds no model version" in msg


def _versions(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "model.onnx").write_bytes(b"")
    return root


def test_a_directory_of_versions_serves_the_highest_and_watches_it(
    make_raw: Callable[..., Raw], tmp_path: Path
) -> None:
    root = _versions(tmp_path / "fraud", "1", "3", "2", "latest")
    raw = make_raw(model={"path": "fraud", "name": "m"})
    spec = parse_config(raw, environ={}, base_dir=tmp_path).pipelines[0].model
    assert (spec.path, spec.version, spec.version_dir) == (root / "3" / "model.onnx", "3", root)
    assert spec.watch is True
    unwatched = make_raw(model={"path": str(root), "name": "m", "watch": False})
    assert parse_config(unwatched, environ={}).pipelines[0].model.watch is False


def test_a_pinned_version_of_a_directory_is_served_and_not_followed(
    make_raw: Callable[..., Raw], tmp_path: Path
) -> None:
    root = _versions(tmp_path / "fraud", "1", "2", "3")
    raw = make_raw(model={"path": str(root), "name": "m", "version": "2"})
    spec = parse_config(raw, environ={}).pipelines[0].model
    assert (spec.path, spec.version, spec.version_dir) == (root / "2" / "model.onnx", "2", None)
    # an environment override pins too
    env = {"STREAMFER_PIPELINES__0__MODEL__VERSION": "1"}
    pinned = parse_config(make_raw(model={"path": str(root), "name": "m"}), environ=env)
    assert pinned.pipelines[0].model.path == root / "1" / "model.onnx"
    msg = config_error(make_raw(model={"path": str(root), "name": "m", "version": "4"}))
    assert "pipelines[0].model.version" in msg and "no version 4" in msg and "1, 2, 3" in msg


def test_a_plain_file_is_not_watched_unless_asked(
    make_raw: Callable[..., Raw], model_file: Path
) -> None:
    spec = parse_config(make_raw(), environ={}).pipelines[0].model
    assert (spec.watch, spec.version_dir, spec.version) == (False, None, "1")
    watched = make_raw(model={"path": str(model_file), "name": "m", "watch": True})
    assert parse_config(watched, environ={}).pipelines[0].model.watch is True
    msg = config_error(make_raw(model={"path": str(model_file), "name": "m", "reload_poll_s": 0}))
    assert "pipelines[0].model.reload_poll_s" in msg


def test_version_dir_is_not_for_the_config_file(
    make_raw: Callable[..., Raw], model_file: Path
) -> None:
    raw = make_raw(model={"path": str(model_file), "name": "m", "version_dir": "/models"})
    assert "pipelines[0].model.version_dir: is set by streamfer" in config_error(raw)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_the_reload_endpoint_is_allowed_on_loopback(
    make_raw: Callable[..., Raw], host: str
) -> None:
    raw = {**make_raw(), "metrics": {"host": host, "port": 9100, "reload_endpoint": True}}
    assert parse_config(raw, environ={}).metrics.reload_endpoint is True


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "worker.internal"])
def test_the_reload_endpoint_is_refused_beyond_loopback(
    make_raw: Callable[..., Raw], host: str
) -> None:
    raw = {**make_raw(), "metrics": {"host": host, "port": 9100, "reload_endpoint": True}}
    msg = config_error(raw)
    assert "metrics" in msg and "reload_endpoint = true needs a loopback host" in msg
    assert repr(host) in msg
    off = {**make_raw(), "metrics": {"host": host, "port": 9100}}
    assert parse_config(off, environ={}).metrics.reload_endpoint is False


def test_relative_model_path_resolves_against_base_dir(
    make_raw: Callable[..., Raw], model_file: Path
) -> None:
    raw = make_raw(model={"path": "models/m.onnx", "name": "m"})
    cfg = parse_config(raw, environ={}, base_dir=model_file.parent.parent)
    assert cfg.pipelines[0].model.path == model_file
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.model\.path"):
        parse_config(raw, environ={}, base_dir=model_file.parent)


def test_same_request_topic_in_two_pipelines(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    raw["pipelines"].append({**raw["pipelines"][0], "name": "q", "result_topic": "res2"})
    msg = config_error(raw)
    assert "request topic 'req' is in pipelines 'p' and 'q'" in msg


def test_duplicate_pipeline_names(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw()
    raw["pipelines"].append({**raw["pipelines"][0], "request_topics": ["other"]})
    assert "pipeline names must be unique" in config_error(raw)


def test_output_topic_that_is_a_request_topic(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(dead_letter_topic="req"))
    assert "output topic 'req' of 'p' is also a request topic" in msg


def test_error_message_names_the_source_file(config_file: Path) -> None:
    config_file.write_text(VALID_TOML.replace("max_batch_size = 64", "max_batch_size = -3"))
    with pytest.raises(ConfigError) as info:
        load_config(config_file, environ={})
    msg = str(info.value)
    assert str(config_file) in msg
    assert "pipelines[0].batch.max_batch_size" in msg


# --- the file itself -----------------------------------------------------------------


def test_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[kafka\nbootstrap_servers = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.toml", environ={})


def test_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('log_format = "text" # caf\xe9\n'.encode("latin-1"))
    with pytest.raises(ConfigError):
        load_config(path, environ={})


# --- environment overrides -----------------------------------------------------------


def test_env_overrides_file(config_file: Path) -> None:
    env = {
        "STREAMFER_KAFKA__BOOTSTRAP_SERVERS": "kafka-9:9093",
        "STREAMFER_PIPELINES__0__BATCH__MAX_WAIT_MS": "5",
        "STREAMFER_PIPELINES__0__FEATURES__FIELDS": '["x", "y"]',
        "STREAMFER_MAX_IN_FLIGHT_BATCHES": "9",
        "OTHER_VARIABLE": "ignored",
    }
    cfg = load_config(config_file, environ=env)
    assert cfg.kafka.bootstrap_servers == "kafka-9:9093"
    assert cfg.kafka.group_id == "scorers"  # untouched
    assert cfg.pipelines[0].batch.max_wait_ms == 5.0
    assert cfg.pipelines[0].batch.max_batch_size == 64  # untouched sibling
    assert cfg.pipelines[0].features.fields == ["x", "y"]
    assert cfg.max_in_flight_batches == 9


def test_env_creates_missing_sections(make_raw: Callable[..., Raw]) -> None:
    env = {"STREAMFER_METRICS__PORT": "9100", "STREAMFER_REDIS__URL": "redis://r:6379/1"}
    cfg = parse_config(make_raw(), environ=env)
    assert cfg.metrics.port == 9100
    assert cfg.redis.url.get_secret_value() == "redis://r:6379/1"


def test_env_booleans_and_strings(make_raw: Callable[..., Raw]) -> None:
    env = {
        "STREAMFER_KAFKA__OPTIONS__ENABLE_SSL": "true",
        "STREAMFER_KAFKA__OPTIONS__CLIENT_ID": "worker one",
    }
    cfg = parse_config(make_raw(), environ=env)
    assert cfg.kafka.options == {"enable_ssl": True, "client_id": "worker one"}


def test_env_value_is_validated(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(), {"STREAMFER_PIPELINES__0__BATCH__MAX_BATCH_SIZE": "0"})
    assert "pipelines[0].batch.max_batch_size" in msg


def test_env_unknown_field_is_rejected(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(), {"STREAMFER_KAFKA__BOOTSTRAP": "x"})
    assert "kafka.bootstrap" in msg
    assert "Extra inputs are not permitted" in msg


def test_env_list_index_out_of_range(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(), {"STREAMFER_PIPELINES__3__NAME": "x"})
    assert "STREAMFER_PIPELINES__3__NAME" in msg
    assert "no list item '3'" in msg


def test_env_cannot_descend_into_a_scalar(make_raw: Callable[..., Raw]) -> None:
    msg = config_error(make_raw(), {"STREAMFER_PIPELINES__0__NAME__X": "y"})
    assert "STREAMFER_PIPELINES__0__NAME__X" in msg
    assert "cannot descend into a str" in msg


def test_os_environ_is_the_default(
    make_raw: Callable[..., Raw], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMFER_KAFKA__GROUP_ID", "from-env")
    assert parse_config(make_raw()).kafka.group_id == "from-env"
    assert parse_config(make_raw(), environ={}).kafka.group_id == "streamfer"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("STREAMFER_KAFKA__GROUP_ID", "12345"),
        ("STREAMFER_PIPELINES__0__MODEL__VERSION", "2"),
    ],
)
def test_env_numeric_looking_string(make_raw: Callable[..., Raw], name: str, value: str) -> None:
    cfg = parse_config(make_raw(), environ={name: value})
    assert value in (cfg.kafka.group_id, cfg.pipelines[0].model.version)


@pytest.mark.parametrize("name", ["STREAMFER_CONFIG", "STREAMFER_CACHE"])
def test_env_variables_of_other_tools_are_not_overrides(config_file: Path, name: str) -> None:
    cfg = load_config(config_file, environ={name: str(config_file)})
    assert cfg.kafka.group_id == "scorers"


def test_feature_spec_direct() -> None:
    spec = FeatureSpec(fields=["a", "b"])
    assert spec.on_missing_field == "default"
    with pytest.raises(ValidationError):
        FeatureSpec(fields=["a"], on_missing_entity="skip")  # type: ignore[arg-type]


# --- request mapping, lookups, model inputs and hooks --------------------------------


def test_features_is_the_lookup_named_entity(make_raw: Callable[..., Raw]) -> None:
    cfg = parse_config(make_raw(), environ={})
    (lookup,) = cfg.pipelines[0].lookups
    assert (lookup.name, lookup.fields) == ("entity", ["a", "b"])
    assert cfg.pipelines[0].entity_path("entity") == "entity"
    # an override of the short form reaches the lookup
    env = {"STREAMFER_PIPELINES__0__FEATURES__KEY_TEMPLATE": "f2:{entity}"}
    cfg = parse_config(make_raw(), environ=env)
    assert cfg.pipelines[0].lookups[0].key_template == "f2:{entity}"


def test_two_lookups_with_a_nested_request_shape(make_raw: Callable[..., Raw]) -> None:
    raw = make_raw(
        features=None,
        request={"id": "meta.request_id", "entities": {"user": "user.id"}},
        lookups=[
            {"name": "user", "key_template": "u:{entity}", "fields": ["age"]},
            {
                "name": "merchant",
                "key_template": "m:{entity}",
                "fields": ["risk"],
                "layout": "packed",
            },
        ],
        model={
            "path": raw_model_path(make_raw),
            "name": "m",
            "inputs": {"x": ["amount", "age", "risk"]},
            "outputs": {"label": "output_label", "class_names": ["legit", "fraud"]},
        },
    )
    p = parse_config(raw, environ={}).pipelines[0]
    assert [lk.name for lk in p.lookups] == ["user", "merchant"]
    assert p.entity_path("user") == "user.id"
    assert p.entity_path("merchant") == "merchant"  # by default, a field named after it
    assert p.model.class_names == ["legit", "fraud"]
    assert p.model.outputs == {"label": "output_label"}


def raw_model_path(make_raw: Callable[..., Raw]) -> str:
    path: str = make_raw()["pipelines"][0]["model"]["path"]
    return path


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (
            {"lookups": [{"name": "x", "fields": ["c"]}]},
            "give either features or lookups, not both",
        ),
        (
            {
                "features": None,
                "lookups": [{"name": "u", "fields": ["a"]}, {"name": "m", "fields": ["a"]}],
            },
            "feature 'a' is in lookups 'u' and 'm'",
        ),
        (
            {
                "features": None,
                "lookups": [{"name": "u", "fields": ["a"]}, {"name": "u", "fields": ["b"]}],
            },
            "lookup names must be unique",
        ),
        ({"request": {"entities": {"merchant": "m.id"}}}, "which are not lookups ['entity']"),
        ({"request": {"id": "meta..id"}}, "pipelines[0].request.id"),
        ({"request": {"entities": {"entity": "a b"}}}, "is not a dotted path"),
        ({"hooks": {"prepare": "no_colon"}}, "pipelines[0].hooks.prepare"),
        ({"features": None}, "no lookups and no model.inputs"),
        ({"features": {"fields": []}}, "pipelines[0].features.fields"),
    ],
)
def test_request_and_lookup_errors_name_the_field(
    make_raw: Callable[..., Raw], pipeline: dict[str, Any], message: str
) -> None:
    assert message in config_error(make_raw(**pipeline))


def test_class_names_given_twice_is_refused(make_raw: Callable[..., Raw]) -> None:
    model = {
        "path": raw_model_path(make_raw),
        "name": "m",
        "class_names": ["a"],
        "outputs": {"class_names": ["b"]},
    }
    assert "class_names is given twice" in config_error(make_raw(model=model))


# --- GPU options: [pipelines.model.cuda] and [pipelines.model.tensorrt] -------------------

GPU_TOML = """
[[pipelines]]
name = "gpu"
request_topics = ["req"]
result_topic = "res"
dead_letter_topic = "dlq"

[pipelines.features]
fields = ["f0"]

[pipelines.model]
path = "models/m.onnx"
name = "m"
providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
pad_to_buckets = true

[pipelines.model.cuda]
device_id = 1
cudnn_conv_algo_search = "HEURISTIC"
arena_extend_strategy = "kSameAsRequested"
gpu_mem_limit_mb = 8192

[pipelines.model.tensorrt]
fp16 = true
engine_cache_dir = "trt/engines"
timing_cache_dir = "trt/timing"
max_workspace_mb = 2048
builder_optimization_level = 4
"""


def test_gpu_options_load_and_cache_dirs_resolve_against_the_config(
    tmp_path: Path, model_file: Path
) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text(GPU_TOML)
    model = load_config(path, environ={}).pipelines[0].model
    assert model.providers[0] == "TensorrtExecutionProvider"
    assert (model.cuda.device_id, model.cuda.cudnn_conv_algo_search) == (1, "HEURISTIC")
    assert (model.cuda.arena_extend_strategy, model.cuda.gpu_mem_limit_mb) == (
        "kSameAsRequested",
        8192,
    )
    trt = model.tensorrt
    assert trt.fp16 and trt.max_workspace_mb == 2048 and trt.builder_optimization_level == 4
    assert trt.engine_cache_dir == tmp_path / "trt" / "engines"
    assert trt.timing_cache_dir == tmp_path / "trt" / "timing"
    assert trt.engine_cache_dir.is_dir() and trt.timing_cache_dir.is_dir()  # made at load
    assert (model.pad_to_buckets, model.io_binding) == (True, None)


def test_gpu_options_default_to_runtimes_own_and_automatic_padding(
    make_raw: Callable[..., Raw],
) -> None:
    model = parse_config(make_raw(), environ={}).pipelines[0].model
    assert model.cuda.model_dump() == {
        "device_id": 0,
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "arena_extend_strategy": "kNextPowerOfTwo",
        "gpu_mem_limit_mb": None,
    }
    assert model.tensorrt.engine_cache_dir is None and not model.tensorrt.fp16
    assert (model.pad_to_buckets, model.io_binding) == (None, None)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cuda": {"cudnn_conv_algo_search": "FAST"}}, "model.cuda.cudnn_conv_algo_search"),
        ({"cuda": {"arena_extend_strategy": "grow"}}, "model.cuda.arena_extend_strategy"),
        ({"cuda": {"gpu_mem_limit_mb": 0}}, "model.cuda.gpu_mem_limit_mb"),
        ({"cuda": {"use_io_binding": True}}, "model.cuda.use_io_binding"),
        ({"tensorrt": {"builder_optimization_level": 6}}, "tensorrt.builder_optimization_level"),
        ({"tensorrt": {"fp8": True}}, "model.tensorrt.fp8"),
        ({"pad_to_buckets": False, "io_binding": True}, "io_binding = true needs pad_to_buckets"),
    ],
)
def test_bad_gpu_options_name_the_field(
    make_raw: Callable[..., Raw], options: dict[str, Any], field: str
) -> None:
    model = {"path": raw_model_path(make_raw), "name": "m", **options}
    assert field in config_error(make_raw(model=model))


@pytest.mark.parametrize("which", ["engine_cache_dir", "timing_cache_dir"])
def test_a_tensorrt_cache_dir_that_cannot_be_written_stops_start_up(
    make_raw: Callable[..., Raw], tmp_path: Path, which: str
) -> None:
    not_a_dir = tmp_path / "cache-file"
    not_a_dir.write_text("a file where the cache folder should be")
    under_a_file = not_a_dir / "engines"
    for folder, why in ((not_a_dir, "is not a directory"), (under_a_file, "cannot be created")):
        model = {
            "path": raw_model_path(make_raw),
            "name": "m",
            "providers": ["TensorrtExecutionProvider", "CPUExecutionProvider"],
            "tensorrt": {which: str(folder)},
        }
        msg = config_error(make_raw(model=model))
        assert f"pipelines[0].model.tensorrt.{which}: {folder} {why}" in msg
    # the same folder is not looked at when TensorRT is not asked for
    model = {"path": raw_model_path(make_raw), "name": "m", "tensorrt": {which: str(not_a_dir)}}
    parse_config(make_raw(model=model), environ={})


def test_gpu_options_from_the_environment(make_raw: Callable[..., Raw]) -> None:
    env = {
        "STREAMFER_PIPELINES__0__MODEL__CUDA__DEVICE_ID": "3",
        "STREAMFER_PIPELINES__0__MODEL__TENSORRT__FP16": "true",
        "STREAMFER_PIPELINES__0__MODEL__PAD_TO_BUCKETS": "false",
    }
    model = parse_config(make_raw(), environ=env).pipelines[0].model
    assert (model.cuda.device_id, model.tensorrt.fp16, model.pad_to_buckets) == (3, True, False)


# --- priority lanes -----------------------------------------------------------------------


def two_pipelines(make_raw: Callable[..., Raw], **second: Any) -> Raw:
    """An interactive pipeline and a second one (``second``: its fields)."""
    raw = make_raw()
    bulk = {**raw["pipelines"][0], "name": "bulk", "request_topics": ["req2"], **second}
    raw["pipelines"][0]["priority"] = "interactive"
    raw["pipelines"].append(bulk)
    return raw


def test_priorities_by_name_or_number_and_the_default_share(
    make_raw: Callable[..., Raw],
) -> None:
    cfg = parse_config(two_pipelines(make_raw, priority="bulk"), environ={})
    live, bulk = cfg.pipelines
    assert (live.rank, bulk.rank) == (10, -10)
    assert cfg.in_flight_bound == 4 * 256
    assert (cfg.in_flight_share(live), cfg.in_flight_share(bulk)) == (None, 0.5)
    numbered = parse_config(two_pipelines(make_raw, priority=3), environ={})
    assert numbered.pipelines[1].rank == 3
    assert numbered.in_flight_share(numbered.pipelines[1]) == 0.5, "lower than interactive"


def test_no_priorities_means_one_lane_and_no_shares(make_raw: Callable[..., Raw]) -> None:
    raw = two_pipelines(make_raw)
    raw["pipelines"][0].pop("priority")
    cfg = parse_config(raw, environ={})
    assert {p.rank for p in cfg.pipelines} == {0}
    assert [cfg.in_flight_share(p) for p in cfg.pipelines] == [None, None]


def test_an_explicit_share_applies_to_any_priority(make_raw: Callable[..., Raw]) -> None:
    raw = two_pipelines(make_raw, max_in_flight_share=0.75)
    raw["pipelines"][0]["max_in_flight_share"] = 0.25
    raw["bulk_in_flight_share"] = 0.3
    cfg = parse_config(raw, environ={})
    assert [cfg.in_flight_share(p) for p in cfg.pipelines] == [0.25, 0.75]


def test_priority_from_the_environment(make_raw: Callable[..., Raw]) -> None:
    raw = two_pipelines(make_raw)
    cfg = parse_config(
        raw, environ={"STREAMFER_PIPELINES__1__PRIORITY": "-5", "STREAMFER_MAX_OVERTAKEN_MS": "50"}
    )
    assert cfg.pipelines[1].rank == -5 and cfg.max_overtaken_ms == 50


@pytest.mark.parametrize("value", ["urgent", "5", 101, -101, True, 1.5])
def test_a_bad_priority_names_the_field_and_what_is_allowed(
    make_raw: Callable[..., Raw], value: Any
) -> None:
    msg = config_error(two_pipelines(make_raw, priority=value))
    assert "pipelines[1].priority" in msg
    assert "'interactive', 'normal', 'bulk' or an integer from -100 to 100" in msg


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("pipeline", 0, "pipelines[1].max_in_flight_share"),
        ("pipeline", 1.5, "pipelines[1].max_in_flight_share"),
        ("top", 0, "bulk_in_flight_share"),
        ("top", -0.5, "bulk_in_flight_share"),
        ("overtaken", 0, "max_overtaken_ms"),
    ],
)
def test_a_share_out_of_range_names_the_field(
    make_raw: Callable[..., Raw], where: str, value: float, field: str
) -> None:
    raw = two_pipelines(make_raw, priority="bulk")
    if where == "pipeline":
        raw["pipelines"][1]["max_in_flight_share"] = value
    elif where == "top":
        raw["bulk_in_flight_share"] = value
    else:
        raw["max_overtaken_ms"] = value
    assert field in config_error(raw)


def test_a_share_smaller_than_one_batch_is_refused(make_raw: Callable[..., Raw]) -> None:
    raw = two_pipelines(make_raw, priority="bulk", max_in_flight_share=0.2)  # 204 < 256
    msg = config_error(raw)
    assert "pipelines[1].max_in_flight_share: 0.2 of the in-flight bound (1024 records" in msg
    assert "less than one batch of 'bulk' (max_batch_size 256)" in msg
    raw = two_pipelines(make_raw, priority="bulk")
    raw["bulk_in_flight_share"] = 0.2
    assert "bulk_in_flight_share (which applies to pipelines[1], 'bulk')" in config_error(raw)
    raw["pipelines"][1]["batch"] = {"max_batch_size": 204}  # just fits
    parse_config(raw, environ={})


# --- canary and shadow ---------------------------------------------------------------


def test_a_canary_file_needs_its_version_and_a_directory_gives_it(
    make_raw: Callable[..., Raw], tmp_path: Path, model_file: Path
) -> None:
    msg = config_error(make_raw(canary={"model": str(model_file), "percent": 10}))
    assert "pipelines[0].canary.version: name the version of m.onnx" in msg
    root = _versions(tmp_path / "candidates", "4", "5")
    raw = make_raw(canary={"model": "candidates", "percent": 12.5})
    canary = parse_config(raw, environ={}, base_dir=tmp_path).pipelines[0].canary
    assert canary is not None
    assert (canary.model, canary.version, canary.percent) == (root / "5" / "model.onnx", "5", 12.5)
    pinned = make_raw(canary={"model": str(root), "version": "4", "percent": 1})
    canary = parse_config(pinned, environ={}).pipelines[0].canary
    assert canary is not None and canary.model == root / "4" / "model.onnx"


@pytest.mark.parametrize("percent", [0, -5, 100.1])
def test_a_canary_percent_must_be_a_share(
    make_raw: Callable[..., Raw], model_file: Path, percent: float
) -> None:
    canary = {"model": str(model_file), "version": "2", "percent": percent}
    assert "pipelines[0].canary.percent" in config_error(make_raw(canary=canary))


@pytest.mark.parametrize("percent", [0.004, 0.0099])
def test_a_canary_percent_below_one_bucket_is_refused_naming_the_smallest(
    make_raw: Callable[..., Raw], model_file: Path, percent: float
) -> None:
    """0.004 once validated and then scored no record: 10,000 buckets, none below 0.4."""
    canary = {"model": str(model_file), "version": "2", "percent": percent}
    msg = config_error(make_raw(canary=canary))
    assert "pipelines[0].canary.percent" in msg
    assert f"{percent} is below 0.01, the smallest share a canary can take" in msg
    assert "it would score no record" in msg


@pytest.mark.parametrize(
    ("percent", "buckets"),
    [(0.01, 1), (0.0101, 1), (0.0149, 1), (0.015, 2), (12.345, 1235), (100, 10_000)],
)
def test_a_canary_percent_of_a_bucket_or_more_is_honoured_to_the_nearest_bucket(
    make_raw: Callable[..., Raw], model_file: Path, percent: float, buckets: int
) -> None:
    canary = {"model": str(model_file), "version": "2", "percent": percent}
    spec = parse_config(make_raw(canary=canary), environ={}).pipelines[0].canary
    assert spec is not None and spec.percent == percent
    assert canary_buckets(percent) == buckets


def test_a_missing_candidate_file_names_its_field(
    make_raw: Callable[..., Raw], tmp_path: Path
) -> None:
    shadow = {"model": str(tmp_path / "nope.onnx"), "version": "2", "topic": "shadow"}
    msg = config_error(make_raw(shadow=shadow))
    assert "pipelines[0].shadow.model: model file not found" in msg


def test_a_candidate_spec_shares_the_pipeline_models_settings(
    make_raw: Callable[..., Raw], model_file: Path
) -> None:
    shadow = {"model": str(model_file), "version": "9", "topic": "shadow"}
    cfg = parse_config(make_raw(shadow=shadow), environ={}).pipelines[0]
    assert cfg.shadow is not None
    spec = cfg.shadow.model_spec(cfg.model)
    assert (spec.path, spec.name, spec.version, spec.sha256) == (model_file, "m", "9", None)
    assert spec.providers == cfg.model.providers and spec.watch is False


@pytest.mark.parametrize("topic", ["res", "dlq", "req"])
def test_the_shadow_topic_is_its_own(
    make_raw: Callable[..., Raw], model_file: Path, topic: str
) -> None:
    shadow = {"model": str(model_file), "version": "2", "topic": topic}
    msg = config_error(make_raw(shadow=shadow))
    assert repr(topic) in msg and ("shadow.topic" in msg or "also a request topic" in msg)


def test_a_cache_beside_a_canary_or_shadow_is_refused(
    make_raw: Callable[..., Raw], model_file: Path
) -> None:
    canary = {"model": str(model_file), "version": "2", "percent": 10}
    msg = config_error(make_raw(cache={"enabled": True}, canary=canary))
    assert "cache.enabled = true with a canary" in msg
    shadow = {"model": str(model_file), "version": "2", "topic": "shadow"}
    msg = config_error(make_raw(cache={"enabled": True}, shadow=shadow))
    assert "cache.enabled = true with a shadow" in msg


# --- the consumer group protocol (KIP-848) ------------------------------------------


def test_the_consumer_protocol_refuses_what_moved_to_the_broker(
    make_raw: Callable[..., Raw],
) -> None:
    raw = {
        **make_raw(),
        "kafka": {
            "group_protocol": "consumer",
            "session_timeout_ms": 10000,
            "assignor": "roundrobin",
            "consumer_options": {"partition.assignment.strategy": "range"},
            "options": {"heartbeat.interval.ms": 500},
        },
    }
    msg = config_error(raw)
    assert "[kafka] session_timeout_ms (the broker's group.consumer.session.timeout.ms)" in msg
    assert "[kafka] assignor (the broker's group.consumer.assignors" in msg
    assert "heartbeat.interval.ms' (the broker's group.consumer.heartbeat.interval.ms)" in msg
    assert "'partition.assignment.strategy' (the broker's group.consumer.assignors" in msg


def test_the_classic_protocol_keeps_its_client_settings(make_raw: Callable[..., Raw]) -> None:
    raw = {**make_raw(), "kafka": {"session_timeout_ms": 10000, "heartbeat_interval_ms": 500}}
    assert WorkerConfig.model_validate(raw).kafka.group_protocol == "classic"


def test_the_consumer_protocol_with_defaults_is_valid(make_raw: Callable[..., Raw]) -> None:
    raw = {**make_raw(), "kafka": {"group_protocol": "consumer", "group_instance_id": "a"}}
    assert WorkerConfig.model_validate(raw).kafka.group_protocol == "consumer"


def test_group_protocol_is_a_typed_setting_never_a_raw_option(
    make_raw: Callable[..., Raw],
) -> None:
    raw = {**make_raw(), "kafka": {"consumer_options": {"group.protocol": "consumer"}}}
    msg = config_error(raw)
    assert "consumer_options sets group.protocol = 'consumer'" in msg
    assert 'set [kafka] group_protocol = "consumer" instead' in msg


def test_an_unknown_group_protocol_is_refused(make_raw: Callable[..., Raw]) -> None:
    msg = config_error({**make_raw(), "kafka": {"group_protocol": "share"}})
    assert "kafka.group_protocol" in msg and "'classic' or 'consumer'" in msg


def test_group_protocol_comes_from_the_environment(config_file: Path) -> None:
    cfg = load_config(config_file, environ={"STREAMFER_KAFKA__GROUP_PROTOCOL": "consumer"})
    assert cfg.kafka.group_protocol == "consumer"


# --- share groups (KIP-932) ----------------------------------------------------------


def test_a_share_group_with_defaults_is_valid(make_raw: Callable[..., Raw]) -> None:
    cfg = WorkerConfig.model_validate({**make_raw(), "kafka": {"share_group": True}})
    assert cfg.kafka.share_group and cfg.kafka.share_delivery_count_limit is None


def test_a_share_group_comes_from_the_environment(config_file: Path) -> None:
    cfg = load_config(config_file, environ={"STREAMFER_KAFKA__SHARE_GROUP": "true"})
    assert cfg.kafka.share_group


def test_exactly_once_with_a_share_group_is_refused_naming_why(
    make_raw: Callable[..., Raw],
) -> None:
    raw = {**make_raw(), "delivery": "exactly-once", "kafka": {"share_group": True}}
    msg = config_error(raw)
    assert 'delivery = "exactly-once" with [kafka] share_group = true' in msg
    assert "KIP-1289" in msg


@pytest.mark.parametrize(
    ("kafka", "expected"),
    [
        ({"group_instance_id": "a"}, "group_instance_id (share groups have no static"),
        ({"group_protocol": "consumer"}, 'group_protocol = "consumer" (a share group'),
        ({"auto_offset_reset": "error"}, 'auto_offset_reset = "error"'),
        ({"session_timeout_ms": 10000}, "session_timeout_ms (the group's share.session.timeout"),
        ({"heartbeat_interval_ms": 500}, "heartbeat_interval_ms (the group's share.heartbeat"),
        ({"assignor": "range"}, "assignor (the group's group.share.assignors)"),
        (
            {"consumer_options": {"partition.assignment.strategy": "range"}},
            "'partition.assignment.strategy' (the group's group.share.assignors)",
        ),
        (
            {"options": {"auto.offset.reset": "earliest"}},
            "options 'auto.offset.reset' (the group's share.auto.offset.reset",
        ),
    ],
)
def test_a_share_group_refuses_what_it_would_ignore(
    make_raw: Callable[..., Raw], kafka: dict[str, Any], expected: str
) -> None:
    msg = config_error({**make_raw(), "kafka": {"share_group": True, **kafka}})
    assert "share_group = true cannot use" in msg and expected in msg


def test_a_share_group_refuses_shares_of_the_in_flight_bound(
    make_raw: Callable[..., Raw],
) -> None:
    msg = config_error({**make_raw(max_in_flight_share=0.5), "kafka": {"share_group": True}})
    assert "pipelines[0].max_in_flight_share with [kafka] share_group = true" in msg
    raw = {**make_raw(), "bulk_in_flight_share": 0.3, "kafka": {"share_group": True}}
    assert "bulk_in_flight_share with [kafka] share_group" in config_error(raw)


def test_the_delivery_count_limit_is_for_share_groups_and_within_the_brokers_range(
    make_raw: Callable[..., Raw],
) -> None:
    msg = config_error({**make_raw(), "kafka": {"share_delivery_count_limit": 5}})
    assert "share_delivery_count_limit is for share_group = true only" in msg
    raw = {**make_raw(), "kafka": {"share_group": True, "share_delivery_count_limit": 1}}
    assert "kafka.share_delivery_count_limit" in config_error(raw)
    raw["kafka"]["share_delivery_count_limit"] = 3
    assert WorkerConfig.model_validate(raw).kafka.share_delivery_count_limit == 3

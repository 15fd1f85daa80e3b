"""Avro results: the schema derived from the model's outputs, registered or required,
and each result framed as the registry's serializers frame it.

confluent-kafka's in-process mock registry stands in here; the integration tests write
and read real Avro results through Apicurio Registry."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import schemaless_reader
from pydantic import ValidationError

from worker.config import PipelineConfig, WorkerConfig
from worker.errors import ConfigError
from worker.registry import AvroResults, derived_schema
from worker.registry.avro_schema import parse_avro

SAMPLE = {"label": 1, "scores": [0.25, 0.75], "accepted": True, "segment": "a"}


@pytest.fixture
def registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": "mock://results"})


def pipeline(**more: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "fraud-v2",
            "request_topics": ["req"],
            "result_topic": "res",
            "dead_letter_topic": "dlq",
            "features": {"fields": ["a"]},
            "model": {"path": "m.onnx", "name": "m", "version": "1"},
            "result_format": "avro",
            **more,
        }
    )


def result(**outputs: Any) -> dict[str, Any]:
    return {
        "id": "r1",
        "key": None,
        "outputs": {**SAMPLE, **outputs},
        "request_ts_ms": 1_796_000_000_000,
        "model": {"name": "m", "version": "1", "sha256": "ab" * 32},
        "pipeline": "fraud-v2",
        "timings_ms": {"wait_ms": 1.5, "infer_ms": 0.25},
    }


def test_the_derived_schema_types_each_output_and_names_the_pipeline() -> None:
    schema = derived_schema("fraud-v2", SAMPLE)
    assert schema["namespace"] == "streamfer.fraud_v2"
    (outputs,) = [f["type"] for f in schema["fields"] if f["name"] == "outputs"]
    assert {f["name"]: f["type"] for f in outputs["fields"]} == {
        "label": "long",
        "scores": {"type": "array", "items": "double"},
        "accepted": "boolean",
        "segment": "string",
    }
    with pytest.raises(ConfigError, match="'p-1' is not an Avro field name"):
        derived_schema("x", {"p-1": 0.5})


def test_results_round_trip_through_the_registrys_deserializer(
    registry: SchemaRegistryClient,
) -> None:
    results = AvroResults(pipeline(auto_register=True), registry, SAMPLE)
    assert results.subject == "res-value"
    assert registry.get_latest_version("res-value").schema_id == results.schema_id
    value = results.encode(result())
    assert value[0] == 0 and int.from_bytes(value[1:5], "big") == results.schema_id
    ctx = SerializationContext("res", MessageField.VALUE)
    assert AvroDeserializer(registry)(value, ctx) == result()
    with pytest.raises((TypeError, ValueError)):  # publish makes this a dead letter
        results.encode(result(label="not a number"))


def test_without_auto_register_the_schema_must_already_be_there(
    registry: SchemaRegistryClient, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="not registered under subject res-value"):
        AvroResults(pipeline(), registry, SAMPLE)
    own = tmp_path / "result.avsc"
    own.write_text(json.dumps(derived_schema("fraud-v2", SAMPLE)))
    registry.register_schema("res-value", Schema(own.read_text(), "AVRO"))
    found = AvroResults(pipeline(result_schema=str(own)), registry, SAMPLE)
    assert found.schema_id == registry.get_latest_version("res-value").schema_id


def test_the_record_strategy_names_the_subject_by_the_records_full_name(
    registry: SchemaRegistryClient,
) -> None:
    results = AvroResults(
        pipeline(auto_register=True, result_subject_strategy="record"), registry, SAMPLE
    )
    assert results.subject == "streamfer.fraud_v2.Result"


def test_a_result_schema_with_an_invalid_logical_type_is_used_as_the_spec_says(
    registry: SchemaRegistryClient, tmp_path: Path
) -> None:
    schema = derived_schema("fraud-v2", SAMPLE)
    scale_over_precision = {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 5}
    schema["fields"].append({"name": "note", "type": ["null", scale_over_precision]})
    own = tmp_path / "result.avsc"
    own.write_text(json.dumps(schema))
    p = pipeline(auto_register=True, result_schema=str(own))
    results = AvroResults(p, registry, SAMPLE)
    doc = {**result(), "note": b"\x05"}
    value = results.encode(doc)
    held = registry.get_schema(results.schema_id).schema_str
    assert held is not None and json.loads(held) == schema  # registered as written
    assert int.from_bytes(value[1:5], "big") == results.schema_id
    assert schemaless_reader(io.BytesIO(value[5:]), parse_avro(held), None) == doc
    schema["fields"][-1] = {"name": "note", "type": "NoSuchType"}
    own.write_text(json.dumps(schema))
    with pytest.raises(ConfigError, match=r"the result schema cannot be used .*NoSuchType"):
        AvroResults(p, registry, SAMPLE)


def test_avro_result_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match='for result_format = "avro" only'):
        pipeline(result_format="json", auto_register=True)
    with pytest.raises(ValidationError, match="cache keeps results as JSON"):
        pipeline(cache={"enabled": True})
    with pytest.raises(ValidationError, match=r"hooks\.postprocess needs result_schema"):
        pipeline(hooks={"postprocess": "m:f"})
    raw = {"pipelines": [pipeline().model_dump(mode="json")]}
    with pytest.raises(ValidationError, match='write result_format = "avro"'):
        WorkerConfig.model_validate(raw)

"""``streamfer check``'s Schema Registry lines: the registry answers, and what it holds
for each pipeline that reads framed requests or writes Avro results.

A framed request is read by the schema id it carries, so no subject is required; the
subject a TopicNameStrategy producer registers under (``<topic>-value``) is reported
when it exists, with the version and schema id producers will be writing, and refused
when its schema is of another type than the pipeline reads."""

from __future__ import annotations

from typing import Any

from worker.config import PipelineConfig, WorkerConfig
from worker.registry import (
    FRAMED_FORMATS,
    load_message_type,
    outage,
    registry_client,
    start_refusal,
)
from worker.tools.kafka_check import CheckLine

__all__ = ["check_registry"]


def check_registry(config: WorkerConfig) -> list[CheckLine]:
    """The lines; empty when no pipeline uses the registry. Raises ConfigError for
    a Protobuf class that does not import."""
    framed = [p for p in config.pipelines if p.request_format != "json"]
    writing = [p for p in config.pipelines if p.result_format == "avro"]
    if not framed and not writing:
        return []
    for p in framed:
        if p.request_protobuf is not None:
            load_message_type(p.request_protobuf, f"pipelines.{p.name}.request_protobuf")
    settings = config.schema_registry
    if settings.url is None:  # protobuf alone may go without one
        return [CheckLine("schema registry", True, "none configured; schema ids go unchecked")]
    with registry_client(settings) as client:
        return _lines(config, client, framed, writing)


def _lines(
    config: WorkerConfig,
    client: Any,
    framed: list[PipelineConfig],
    writing: list[PipelineConfig],
) -> list[CheckLine]:
    settings = config.schema_registry
    try:
        subjects = set(client.get_subjects())
    except Exception as exc:  # the client raises httpx's errors as well as its own
        why = start_refusal(settings, exc) or str(outage(exc, "listing subjects"))
        return [CheckLine("schema registry", False, why)]
    lines = [
        CheckLine("schema registry", True, f"{settings.url} answers: {len(subjects)} subjects")
    ]
    for p in framed:
        expected = FRAMED_FORMATS[p.request_format]
        for topic in p.request_topics:
            subject = f"{topic}-value"
            name = f"pipeline {p.name} schema"
            if subject not in subjects:
                lines.append(
                    CheckLine(
                        name,
                        True,
                        f"no subject {subject}: each {p.request_format} request is read by "
                        "the schema id it carries",
                    )
                )
                continue
            try:
                latest = client.get_latest_version(subject)
            except Exception as exc:  # as above
                lines.append(CheckLine(name, False, str(outage(exc, f"reading {subject}"))))
                continue
            kind = latest.schema.schema_type or "AVRO"
            lines.append(
                CheckLine(
                    name,
                    kind == expected,
                    f"subject {subject}: version {latest.version}, schema id "
                    f"{latest.schema_id} ({kind})"
                    + ("" if kind == expected else f"; this pipeline reads {expected}"),
                )
            )
    for p in writing:
        name = f"pipeline {p.name} result schema"
        if p.result_subject_strategy != "topic":
            detail = f"subject by the {p.result_subject_strategy} strategy, found at start-up"
            lines.append(CheckLine(name, True, detail))
            continue
        subject = f"{p.result_topic}-value"
        if subject in subjects:
            detail = f"subject {subject} exists; the worker finds its schema there at start-up"
        elif p.auto_register:
            detail = f"no subject {subject} yet: the worker registers it at start-up"
        else:
            detail = f"no subject {subject}: register the result schema, or set auto_register"
        lines.append(CheckLine(name, subject in subjects or p.auto_register, detail))
    return lines

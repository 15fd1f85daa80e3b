"""What the file system resolves in a loaded configuration: secret files read, model
paths made absolute, directories of versions resolved, TensorRT cache folders made and
probed. Side effects the schema itself never has."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import (
    SecretStr,
)

from worker.config.candidates import CandidateSpec
from worker.config.model_spec import ModelSpec, TritonSettings
from worker.config.model_versions import resolve_version
from worker.config.steps import graph_model
from worker.config.worker_config import WorkerConfig
from worker.errors import ConfigError

__all__ = ["read_secret_files", "resolve_and_check_models"]


def read_secret_files(cfg: WorkerConfig, base_dir: Path, source: str) -> WorkerConfig:
    def read(path: Path, field: str) -> SecretStr:
        full = path if path.is_absolute() else base_dir / path
        try:
            return SecretStr(full.read_text().strip())
        except OSError as exc:
            raise ConfigError(f"{source}: {field}: cannot read secret file {full}: {exc}") from None

    kafka, rds = cfg.kafka, cfg.redis
    if kafka.sasl_password_file is not None:
        kafka = kafka.model_copy(
            update={"sasl_password": read(kafka.sasl_password_file, "kafka.sasl_password_file")}
        )
    updates: dict[str, Any] = {}
    if rds.url_file is not None:
        updates["url"] = read(rds.url_file, "redis.url_file")
    if rds.password_file is not None:
        updates["password"] = read(rds.password_file, "redis.password_file")
    if rds.sentinel_password_file is not None:
        updates["sentinel_password"] = read(
            rds.sentinel_password_file, "redis.sentinel_password_file"
        )
    registry = cfg.schema_registry
    if registry.basic_auth_user_info_file is not None:
        registry = registry.model_copy(
            update={
                "basic_auth_user_info": read(
                    registry.basic_auth_user_info_file,
                    "schema_registry.basic_auth_user_info_file",
                )
            }
        )
    return cfg.model_copy(
        update={
            "kafka": kafka,
            "redis": rds.model_copy(update=updates),
            "schema_registry": registry,
        }
    )


def resolve_and_check_models(cfg: WorkerConfig, base_dir: Path, source: str) -> WorkerConfig:
    pipelines = []
    for i, p in enumerate(cfg.pipelines):
        where = f"{source}: pipelines[{i}]"
        steps = [
            step.model_copy(
                update={"model": _resolved(step.model, base_dir, f"{where}.steps[{k}].model")}
            )
            for k, step in enumerate(p.steps or ())
        ]
        model = graph_model(steps) if steps else _resolved(p.model, base_dir, f"{where}.model")
        candidates = {
            role: _candidate_source(spec, p.model, base_dir, f"{where}.{role}")
            for role, spec in (("canary", p.canary), ("shadow", p.shadow))
            if spec is not None
        }
        extra: dict[str, Any] = {"steps": steps} if steps else {}
        if p.result_schema is not None and not p.result_schema.is_absolute():
            extra["result_schema"] = base_dir / p.result_schema
        pipelines.append(p.model_copy(update={"model": model, **candidates, **extra}))
    return cfg.model_copy(update={"pipelines": pipelines})


def _resolved(model: ModelSpec, base_dir: Path, where: str) -> ModelSpec:
    """``model`` with its file (or version), Triton files and TensorRT folders resolved
    against ``base_dir``; raises ConfigError naming the field ``where`` is."""
    update = _model_source(model, base_dir, where)
    trt = model.tensorrt
    dirs = {
        name: folder if folder.is_absolute() else base_dir / folder
        for name in ("engine_cache_dir", "timing_cache_dir")
        if (folder := getattr(trt, name)) is not None
    }
    if dirs:
        update["tensorrt"] = trt.model_copy(update=dirs)
    if "TensorrtExecutionProvider" in model.providers:
        for name, folder in dirs.items():
            problem = _unwritable(folder)
            if problem is not None:
                raise ConfigError(f"{where}.tensorrt.{name}: {folder} {problem}")
    return model.model_copy(update=update)


def _model_source(model: ModelSpec, base_dir: Path, where: str) -> dict[str, Any]:
    """``path``, ``version``, ``version_dir`` and ``watch`` as the worker serves them: a
    file, or a directory of versions resolved to its highest (or pinned) one. Raises
    ConfigError naming the field."""
    if model.triton is not None:
        return _triton_files(model.triton, model.watch, base_dir)
    if model.version_dir is not None:
        raise ConfigError(
            f"{where}.version_dir: is set by streamfer; give the directory of versions as "
            "model.path"
        )
    path = model.file if model.file.is_absolute() else base_dir / model.file
    if path.is_dir():
        pinned = model.version if "version" in model.model_fields_set else None
        field = f"{where}.version" if pinned is not None else f"{where}.path"
        chosen = resolve_version(path, pinned, field=field)
        return {
            "path": chosen.path,
            "version": chosen.name,
            "version_dir": None if pinned is not None else path,
            "watch": True if model.watch is None else model.watch,
        }
    if not path.is_file():
        raise ConfigError(f"{where}.path: model file not found: {path}")
    return {"path": path, "watch": bool(model.watch)}


def _triton_files(triton: TritonSettings, watch: bool | None, base_dir: Path) -> dict[str, Any]:
    """The server's TLS files resolved against the config's directory (the server and its
    model are checked when the worker starts: ``worker.inference.triton``); ``watch``
    on by default when no version is pinned, as for a directory of versions."""
    files = {
        name: base_dir / found
        for name in ("root_certificates", "private_key", "certificate_chain")
        if (found := getattr(triton, name)) is not None and not found.is_absolute()
    }
    update: dict[str, Any] = {"watch": triton.version is None if watch is None else watch}
    if files:
        update["triton"] = triton.model_copy(update=files)
    return update


def _candidate_source(
    spec: CandidateSpec, primary: ModelSpec, base_dir: Path, where: str
) -> CandidateSpec:
    """``model`` as a file and ``version`` set: a directory of versions resolves to its
    highest (or pinned) one; a file needs ``version``. Beside a model on a Triton server
    the candidate is a version of it there, or of another model there (``server_model``):
    no file. Raises ConfigError naming the field."""
    if primary.triton is not None:
        if spec.model is not None or spec.sha256 is not None:
            field = "model" if spec.model is not None else "sha256"
            raise ConfigError(
                f"{where}.{field}: the pipeline's model is on a Triton server; its candidate "
                "is another version of it there (or another model there): give version "
                "(and server_model)"
            )
        if spec.version is None:
            raise ConfigError(f"{where}.version: name the version of the model on the server")
        return spec
    if spec.server_model is not None:
        raise ConfigError(
            f"{where}.server_model: the pipeline's model is no Triton server's; give model"
        )
    if spec.model is None:
        raise ConfigError(f"{where}.model: the candidate ONNX file (or a directory of versions)")
    path = spec.model if spec.model.is_absolute() else base_dir / spec.model
    if path.is_dir():
        field = f"{where}.version" if spec.version is not None else f"{where}.model"
        chosen = resolve_version(path, spec.version, field=field)
        return spec.model_copy(update={"model": chosen.path, "version": chosen.name})
    if not path.is_file():
        raise ConfigError(f"{where}.model: model file not found: {path}")
    if spec.version is None:
        raise ConfigError(
            f"{where}.version: name the version of {path.name} (its results carry it), or "
            "give model as a directory of versions"
        )
    return spec.model_copy(update={"model": path})


def _unwritable(folder: Path) -> str | None:
    """Why TensorRT could not keep its cache files in ``folder`` (made when missing), or
    None when it can."""
    if folder.exists() and not folder.is_dir():
        return "is not a directory"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot be created: {exc.strerror or exc}"
    try:  # a real write: os.access says yes to root on a read-only mount
        fd, probe = tempfile.mkstemp(prefix=".streamfer-probe-", dir=folder)
    except OSError as exc:
        return f"is not writable: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return None

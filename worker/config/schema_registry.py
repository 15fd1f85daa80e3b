"""Where the Schema Registry is and how the worker signs in to it: ``[schema_registry]``.

Pipelines whose requests are Avro, Protobuf or JSON Schema records in the Confluent
wire format (``request_format``) read their writers' schemas from it by id. The user
info is a secret that never prints; ``basic_auth_user_info_file`` is read in at start-up
by ``worker.config.loading``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from worker.config.base import Frozen

__all__ = ["SchemaRegistrySettings"]


class SchemaRegistrySettings(Frozen):
    """A Confluent-compatible registry (Confluent's, Apicurio's ``/apis/ccompat/v7``,
    Redpanda's, Karapace): its base URL, basic auth, TLS and a per-call timeout."""

    url: str | None = Field(
        default=None,
        description=(
            "Base URL, `https://registry:8081` or `http://apicurio:8080/apis/ccompat/v7`."
        ),
    )
    basic_auth_user_info: SecretStr | None = Field(
        default=None, description="`user:password` (Confluent Cloud: `API_KEY:API_SECRET`)."
    )
    basic_auth_user_info_file: Path | None = Field(
        default=None,
        description="Read at start-up into `basic_auth_user_info` (a mounted secret, say).",
    )
    ssl_ca_location: Path | None = Field(
        default=None, description="The CA bundle for a registry signed by a private CA."
    )
    ssl_certificate_location: Path | None = Field(
        default=None, description="Client certificate for mutual TLS (with ssl_key_location)."
    )
    ssl_key_location: Path | None = Field(
        default=None, description="Client key for mutual TLS (with ssl_certificate_location)."
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "Each request to the registry; a registry slower than this is an "
            "outage: the batch waits and retries, nothing is dead-lettered."
        ),
    )
    cache_capacity: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Schemas kept by id (a schema is fetched once per id and process).",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _one_secret_source(self) -> SchemaRegistrySettings:
        if self.basic_auth_user_info is not None and self.basic_auth_user_info_file is not None:
            raise ValueError("set basic_auth_user_info or basic_auth_user_info_file, not both")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("ssl_certificate_location and ssl_key_location go together")
        if self.url is None and self.model_fields_set - {"url"}:
            raise ValueError("url is required when any other [schema_registry] field is set")
        return self

    def client_conf(self) -> dict[str, Any]:
        """The configuration confluent-kafka's ``SchemaRegistryClient`` takes."""
        conf: dict[str, Any] = {
            "url": self.url,
            "timeout": self.timeout_s,
            "cache.capacity": self.cache_capacity,
            # the worker retries an outage itself, batch by batch: one quick try each
            "max.retries": 1,
        }
        if self.basic_auth_user_info is not None:
            conf["basic.auth.user.info"] = self.basic_auth_user_info.get_secret_value()
        if self.ssl_ca_location is not None:
            conf["ssl.ca.location"] = str(self.ssl_ca_location)
        if self.ssl_certificate_location is not None:
            conf["ssl.certificate.location"] = str(self.ssl_certificate_location)
        if self.ssl_key_location is not None:
            conf["ssl.key.location"] = str(self.ssl_key_location)
        return conf

"""The configuration as it may be shown: every secret masked, for logs and
``check --print-config``."""

from __future__ import annotations

from typing import Any

from worker.config.worker_config import WorkerConfig

__all__ = ["LIBRDKAFKA_SECRET_OPTIONS", "redacted"]

LIBRDKAFKA_SECRET_OPTIONS = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.extensions",
        "sasl.kerberos.kinit.cmd",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.password",
        "ssl_engine_callback_data",
    }
)
"""librdkafka properties (its CONFIGURATION.md) whose values are or may hold a secret:
passwords, private keys, OAuth client secrets, and free-form ones that carry them
(``sasl.oauthbearer.config`` holds ``clientSecret=...``; extensions and the kinit
command line may too)."""

# A name with one of these words is masked too: an option librdkafka adds later, or a
# plug-in's, is more likely a secret than not when its name says so.
_SECRET_WORDS = ("password", "passphrase", "secret", "token", "credential", "key")
_MASK = "**********"


def _is_secret_option(name: str) -> bool:
    lowered = name.lower()
    return lowered in LIBRDKAFKA_SECRET_OPTIONS or any(w in lowered for w in _SECRET_WORDS)


def redacted(cfg: WorkerConfig) -> dict[str, Any]:
    """The config as plain data for logs and ``check --print-config``: ``SecretStr``
    fields (the Redis URL and passwords, SASL password) and every librdkafka option that
    can carry a secret, in ``options``, ``consumer_options`` and ``producer_options``,
    are masked."""
    data: dict[str, Any] = cfg.model_dump(mode="json")
    kafka = data["kafka"]
    for section in ("options", "consumer_options", "producer_options"):
        for name in kafka[section]:
            if _is_secret_option(name):
                kafka[section][name] = _MASK
    return data

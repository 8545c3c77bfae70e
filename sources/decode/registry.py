"""The Schema Registry connection: its settings, and writer schemas resolved by id, cached.

Values in the Confluent wire format name their writer schema by a 4-byte id
(:mod:`reclock.sources.decode.confluent`); this module asks the registry for it through
confluent-kafka's ``SchemaRegistryClient`` (the ecosystem's reference client, which caches every
schema it fetched) and sorts what can go wrong into the three kinds of failure:

* the registry answers that the id does not exist (HTTP 404): :class:`UnknownSchema`, a value
  the caller turns into an ``_errors`` row of each record that names it (bad data: a schema id is
  immutable once issued, so the verdict is the same on every replay);
* the registry does not answer, answers 5xx or 429, or refuses the credentials:
  :class:`RegistryUnavailable`, a :class:`~reclock.errors.TransientError`. The batch fails whole
  and is retried: the pipeline stalls until the registry is back, and never lands a row it could
  not decode with the right schema;
* a bad setting: :class:`~reclock.errors.ConfigError` at definition, naming the field.

Settings travel to Spark executors inside the pickled decoder; the client does not (it holds
sockets and threads): each process makes its own, once per settings, on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reclock.errors import ConfigError, TransientError

__all__ = [
    "RegistryUnavailable",
    "RegistrySettings",
    "UnknownSchema",
    "WriterSchema",
    "check_registry",
    "fetch_schema",
    "fetch_version",
]

_KEYS = ("url", "username", "password", "timeout_s")


class RegistryUnavailable(TransientError):
    """The Schema Registry did not answer, or not usefully (5xx, 429, refused credentials).
    Retryable: the batch stalls, nothing of it lands."""


class UnknownSchema(Exception):
    """The registry holds no schema under this id (or subject version): bad data of the records
    that name it, never a stall."""


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is and how to authenticate; the password never shows in a repr."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0

    def client_config(self) -> dict[str, Any]:
        """confluent-kafka's ``SchemaRegistryClient`` configuration. One quick retry: an outage
        is the pipeline's to wait out (a stall with backoff), not the client's."""
        config: dict[str, Any] = {
            "url": self.url,
            "timeout": self.timeout_s,
            "max.retries": 1,
            "retries.wait.ms": 100,
            "retries.max.wait.ms": 500,
        }
        if self.username is not None:
            config["basic.auth.user.info"] = f"{self.username}:{self.password or ''}"
        return config


@dataclass(frozen=True)
class WriterSchema:
    """A schema as the registry holds it: its text, type (``AVRO``, ``PROTOBUF``, ``JSON``) and
    references (``(name, subject, version)``, Protobuf imports)."""

    schema_id: int
    text: str
    schema_type: str
    references: tuple[tuple[str, str, int], ...] = ()


def check_registry(value: Any, where: str) -> RegistrySettings:
    """``schema_registry = {url = "http://...", username = "...", password = "...", timeout_s = 10}``
    checked; errors name the key, never a value (the password may be one)."""
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, Mapping):
        raise ConfigError(where, "must be a table {url = ..., username = ..., password = ...} or a URL")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown option; expected one of {', '.join(_KEYS)}")
    url = value.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.url", "must be an http:// or https:// URL (several: comma-separated)")
    if "@" in url.split("//", 1)[1].split("/", 1)[0]:
        raise ConfigError(f"{where}.url", "must not carry credentials; give username and password")
    username, password = value.get("username"), value.get("password")
    if username is not None and (not isinstance(username, str) or not username or ":" in username):
        raise ConfigError(f"{where}.username", "must be a non-empty string without ':'")
    if password is not None and not isinstance(password, str):
        raise ConfigError(f"{where}.password", "must be a string (not shown)")
    if password is not None and username is None:
        raise ConfigError(f"{where}.password", "needs a username")
    timeout = value.get("timeout_s", 10.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ConfigError(f"{where}.timeout_s", "must be a number of seconds > 0")
    return RegistrySettings(url, username, password, float(timeout))


def fetch_schema(settings: RegistrySettings, schema_id: int, *, serialized: bool = False) -> WriterSchema:
    """The writer schema of ``schema_id`` (``serialized``: Protobuf as a base64 descriptor, the
    form confluent-kafka's deserializer asks for). Raises :class:`UnknownSchema` or
    :class:`RegistryUnavailable`."""
    client = _client(settings)
    schema = _call(settings, lambda: client.get_schema(schema_id, fmt="serialized" if serialized else None))
    return _writer(schema_id, schema)


def fetch_version(settings: RegistrySettings, subject: str, version: int, *, serialized: bool = False) -> WriterSchema:
    """Version ``version`` of ``subject``: a reader schema, or a Protobuf reference."""
    client = _client(settings)
    registered = _call(settings, lambda: client.get_version(subject, version, fmt="serialized" if serialized else None))
    return _writer(int(registered.schema_id or 0), registered.schema)


def _writer(schema_id: int, schema: Any) -> WriterSchema:
    refs = tuple((r.name, r.subject, int(r.version)) for r in (schema.references or ()))
    return WriterSchema(schema_id, schema.schema_str or "", (schema.schema_type or "AVRO").upper(), refs)


def _call(settings: RegistrySettings, request: Any) -> Any:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return request()
    except SchemaRegistryError as exc:
        status = exc.http_status_code
        if status == 404:
            raise UnknownSchema(f"{exc.error_message} (registry code {exc.error_code})") from None
        if status in (401, 403):
            raise RegistryUnavailable(
                f"schema registry {_where(settings)} refused the credentials (HTTP {status}); check "
                "schema_registry.username and password"
            ) from None
        raise RegistryUnavailable(
            f"schema registry {_where(settings)} answered HTTP {status}: {exc.error_message}"
        ) from None
    except Exception as exc:  # httpx's transport errors, timeouts, a refused connection
        raise RegistryUnavailable(f"schema registry {_where(settings)} unreachable: {type(exc).__name__}") from None


def _where(settings: RegistrySettings) -> str:
    return settings.url.split(",")[0].rstrip("/")


_clients: dict[RegistrySettings, Any] = {}
_lock = threading.Lock()


def _client(settings: RegistrySettings) -> Any:
    """This process's client for ``settings`` (one per settings: its cache is shared)."""
    with _lock:
        client = _clients.get(settings)
        if client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as exc:  # the optional dependency is missing
                raise ConfigError(
                    "schema_registry", f"needs confluent-kafka with its schema-registry extras ({exc})"
                ) from exc
            client = _clients[settings] = SchemaRegistryClient(settings.client_config())
        return client

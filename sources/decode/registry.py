"""The Schema Registry connection: its settings, and writer schemas resolved by id, cached.

Values in the Confluent wire format name their writer schema by a 4-byte id
(:mod:`reclock.sources.decode.confluent`); this module asks the registry for it through
confluent-kafka's ``SchemaRegistryClient`` (the ecosystem's reference client, which caches every
schema it fetched) and sorts what can go wrong into the three kinds of failure:

* the registry answers that the id does not exist (HTTP 404): :class:`UnknownSchema`, a value
  the caller turns into an ``_errors`` row of each record that names it (bad data: a schema id is
  immutable once issued, so the verdict is the same on every replay);
* the registry does not answer, answers 5xx or 429, refuses the credentials, or its TLS
  handshake fails (a certificate ``ca_location`` does not sign, a client certificate it wants):
  :class:`RegistryUnavailable`, a :class:`~reclock.errors.TransientError`. The batch fails whole
  and is retried: the pipeline stalls until the registry is back, and never lands a row it could
  not decode with the right schema;
* a bad setting: :class:`~reclock.errors.ConfigError` at definition, naming the field (the TLS
  files are loaded then, as the client will load them).

Settings travel to Spark executors inside the pickled decoder; the client does not (it holds
sockets and threads): each process makes its own, once per settings, on first use.
"""

from __future__ import annotations

import os
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

_KEYS = (
    "url",
    "username",
    "password",
    "timeout_s",
    "ca_location",
    "certificate_location",
    "key_location",
    "key_password",
)


class RegistryUnavailable(TransientError):
    """The Schema Registry did not answer, or not usefully (5xx, 429, refused credentials).
    Retryable: the batch stalls, nothing of it lands."""


class UnknownSchema(Exception):
    """The registry holds no schema under this id (or subject version): bad data of the records
    that name it, never a stall."""


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is and how to authenticate; the passwords never show in a repr."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    #: PEM file of the CAs that sign the registry's certificate (default: the client's, certifi's).
    ca_location: str | None = None
    #: PEM files of a client certificate and its key, for a registry that asks for one (mutual TLS).
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = field(default=None, repr=False)

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
        for key, value in (
            ("ssl.ca.location", self.ca_location),
            ("ssl.certificate.location", self.certificate_location),
            ("ssl.key.location", self.key_location),
            ("ssl.key.password", self.key_password),
        ):
            if value is not None:
                config[key] = value
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
    tls = _check_tls(value, url, where)
    return RegistrySettings(url, username, password, float(timeout), **tls)


def _check_tls(value: Mapping[str, Any], url: str, where: str) -> dict[str, str | None]:
    """The TLS options checked by loading them as the client will: a file that is missing, not
    PEM, or a key that does not open is an error naming its option, at definition."""
    import ssl

    tls = {k: value.get(k) for k in ("ca_location", "certificate_location", "key_location", "key_password")}
    for key, path in tls.items():
        if path is not None and (not isinstance(path, str) or not path):
            raise ConfigError(
                f"{where}.{key}",
                "must be a non-empty string" + (" (not shown)" if key == "key_password" else " (a PEM file)"),
            )
    if any(v is not None for v in tls.values()) and not all(u.strip().startswith("https://") for u in url.split(",")):
        set_key = next(k for k, v in tls.items() if v is not None)
        raise ConfigError(f"{where}.{set_key}", "needs an https:// url")
    for key in ("ca_location", "certificate_location", "key_location"):
        path = tls[key]
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{where}.{key}", f"no such file: {path}")
    if tls["certificate_location"] is None:
        for key in ("key_location", "key_password"):
            if tls[key] is not None:
                raise ConfigError(f"{where}.{key}", "needs certificate_location (the client certificate)")
    if tls["ca_location"] is not None:
        try:
            ssl.create_default_context(cafile=tls["ca_location"])
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"{where}.ca_location", f"not a PEM file of CA certificates: {exc}") from None
    if tls["certificate_location"] is not None:
        _check_client_certificate(tls, where)
    return tls


def _check_client_certificate(tls: dict[str, Any], where: str) -> None:
    """The client certificate, its key and the key's password load together; otherwise the
    option at fault is named (OpenSSL's own message says only "PEM lib")."""
    import ssl

    cert, key, password = tls["certificate_location"], tls["key_location"], tls["key_password"]
    key_field = "key_location" if key is not None else "certificate_location"
    with open(cert, "rb") as file:
        if b"-----BEGIN CERTIFICATE-----" not in file.read():
            raise ConfigError(f"{where}.certificate_location", "holds no PEM certificate")
    with open(key or cert, "rb") as file:
        key_text = file.read()
    if b"PRIVATE KEY-----" not in key_text:
        raise ConfigError(f"{where}.{key_field}", "holds no PEM private key")
    if password is None and (b"ENCRYPTED PRIVATE KEY" in key_text or b"Proc-Type: 4,ENCRYPTED" in key_text):
        raise ConfigError(f"{where}.key_password", "needed: the private key is encrypted")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password or "")
    except (ssl.SSLError, ValueError) as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise ConfigError(f"{where}.{key_field}", "is not the key of certificate_location") from None
        if password is not None:
            raise ConfigError(f"{where}.key_password", "does not open the private key (not shown)") from None
        raise ConfigError(f"{where}.{key_field}", f"the private key does not load: {exc}") from None


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
        tls = _tls_failure(exc)
        if tls is not None:
            raise RegistryUnavailable(f"schema registry {_where(settings)}: TLS handshake failed: {tls}") from None
        raise RegistryUnavailable(f"schema registry {_where(settings)} unreachable: {type(exc).__name__}") from None


def _tls_failure(exc: BaseException) -> str | None:
    """What a refused TLS handshake says, and which setting to check; ``None`` for other errors."""
    import ssl

    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, ssl.SSLError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    if isinstance(seen, ssl.SSLCertVerificationError):
        return (
            f"the registry's certificate is not trusted ({seen.verify_message}); check "
            "schema_registry.ca_location (the CA that signs the registry's certificate)"
        )
    reason = seen.reason or str(seen)
    return f"{reason}; check schema_registry.certificate_location and key_location (a client certificate)"


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

"""The kafka-python clients of the Kafka source: how each one is configured, and the driver's
two long-lived ones.

Every client is a ``KafkaConsumer`` built by :meth:`KafkaClients.consumer` from the user's
``client_settings`` (SASL, SSL, timeouts) with reclock's own settings laid over them: no group
position, no auto commit, no offset reset, the source's ``isolation_level``, no topic auto-creation. Exact,
replayable reads depend on those, so :func:`check_client_settings` refuses a user value for them.
The settings are never logged or shown in ``repr``.

Which client serves what, and why:

* a **probe** asks its metadata and its capped fetch on a pooled read client (below), and gets a
  fresh consumer only for the partitions that fetch leaves unanswered, which it polls:
  kafka-python keeps buffered and in-flight fetch responses across ``unsubscribe``/``assign``,
  so a reused one can answer with an earlier probe's high watermark;
* **reads** borrow a client from a per-process pool (:func:`~reclock.sources.kafka.fetcher.lease`): the
  fetcher sends its own fetch requests on the client's connections and never assigns it, so
  nothing of an earlier read can leak into a later one;
* low watermarks and timestamp lookups share one long-lived **probe client** on the driver, and
  offset commits one long-lived **commit client**; either is dropped (closed) after a failure and
  created again on next use, and neither is pickled, so the source can travel to Spark executors.

A broker that does not answer is transient trouble: :class:`SourceTimeout`, which the pipeline
retries. :func:`bounded` puts a deadline on the kafka-python calls that have none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from reclock.errors import ConfigError, TransientError, describe

__all__ = ["KafkaClients", "SourceTimeout", "bounded", "check_client_settings", "close_client", "is_transient"]

log = logging.getLogger(__name__)

#: Client settings reclock owns: a user value would break exact, replayable reads.
_RESERVED_SETTINGS = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "auto_offset_reset",
        "key_deserializer",
        "value_deserializer",
        "isolation_level",
        "allow_auto_create_topics",
        "consumer_timeout_ms",
    }
)


class SourceTimeout(TransientError):
    """The broker did not answer in time (down, paused, unreachable). Retryable: the pipeline
    stalls and retries the batch; the data itself is fine."""


def check_client_settings(settings: Any) -> dict[str, Any]:
    """A copy of ``settings`` if every key is a kafka-python consumer setting reclock leaves to
    the user; the error names the key, never a value (values may be secrets)."""
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ConfigError("client_settings", "must be a mapping of kafka-python settings")
    from kafka import KafkaConsumer

    known = set(KafkaConsumer.DEFAULT_CONFIG)
    for key in settings:
        if not isinstance(key, str):
            raise ConfigError("client_settings", "keys must be strings")
        if key in _RESERVED_SETTINGS:
            raise ConfigError(f"client_settings.{key}", "is set by reclock (exact, replayable reads need it)")
        if key not in known:
            raise ConfigError(f"client_settings.{key}", "is not a kafka-python consumer setting")
    return dict(settings)


class KafkaClients:
    """Builds the source's consumers and holds the driver's long-lived ones (see the module
    docstring). ``read_timeout_s`` bounds every request a client makes."""

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        settings: dict[str, Any],
        read_timeout_s: float,
        *,
        read_committed: bool = True,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.settings = settings
        self.read_timeout_s = read_timeout_s
        #: ``isolation_level = "read_committed"``: every fetch asks for it, the probe's end is the
        #: last stable offset (:mod:`reclock.sources.kafka.transactions`).
        self.read_committed = read_committed
        self.probe_client: Any = None
        self.commit_client: Any = None

    def where(self) -> str:
        """The brokers, for messages (never the settings)."""
        return f"bootstrap_servers={self.bootstrap_servers!r}"

    def consumer(self, *, deadline: float | None, **overrides: Any) -> Any:
        """A new consumer; ``deadline`` (monotonic) caps the bootstrap wait. Raises
        :class:`SourceTimeout` when the brokers cannot be reached."""
        from kafka import KafkaConsumer

        budget_ms = int(self.read_timeout_s * 1000)
        if deadline is not None:
            budget_ms = max(1, min(budget_ms, int((deadline - time.monotonic()) * 1000)))
        config: dict[str, Any] = {
            "client_id": "reclock",
            "request_timeout_ms": max(1000, min(30_000, int(self.read_timeout_s * 1000))),
            "bootstrap_timeout_ms": budget_ms,
            "retry_backoff_ms": 100,
            "reconnect_backoff_max_ms": 1000,
            "check_crcs": True,
        }
        config.update(self.settings)
        config.update(
            {
                "bootstrap_servers": self.bootstrap_servers,
                "group_id": None,
                "enable_auto_commit": False,
                "auto_offset_reset": "none",
                "isolation_level": "read_committed" if self.read_committed else "read_uncommitted",
                "allow_auto_create_topics": False,
            }
        )
        config.update(overrides)
        if config.get("fetch_max_wait_ms", 500) >= config["request_timeout_ms"]:
            config["fetch_max_wait_ms"] = max(1, config["request_timeout_ms"] // 2)
        try:
            return KafkaConsumer(**config)
        except Exception as exc:
            if is_transient(exc):
                raise SourceTimeout(f"kafka: cannot reach the brokers: {describe(exc)} ({self.where()})") from exc
            raise

    def for_fetch(self, deadline: float) -> Any:
        """A client for the fetcher (:mod:`reclock.sources.kafka.fetcher`): never assigned, it only lends
        its connections; responses may carry 8 MiB per partition, 64 MiB in all."""
        return self.consumer(deadline=deadline, max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)

    def pool_key(self) -> tuple[Any, ...]:
        """What makes two fetch clients interchangeable: the brokers and every user setting."""
        servers = self.bootstrap_servers if isinstance(self.bootstrap_servers, str) else tuple(self.bootstrap_servers)
        return (servers, tuple(sorted((k, repr(v)) for k, v in self.settings.items())))

    def for_probe(self) -> Any:
        """A fresh consumer for what one probe's capped fetch leaves unanswered (and for the
        driver's long-lived probe client)."""
        return self.consumer(
            deadline=None,
            auto_offset_reset="earliest",  # a last known end beyond the log resets, then answers
            max_partition_fetch_bytes=1024,  # only the high watermark matters
            fetch_max_wait_ms=5,
            retry_backoff_ms=20,  # also spaces metadata refreshes: each probe needs one
        )

    def probe(self) -> Any:
        """The driver's long-lived consumer for low watermarks and timestamp lookups."""
        if self.probe_client is None:
            self.probe_client = self.for_probe()
        return self.probe_client

    def drop_probe(self) -> None:
        client, self.probe_client = self.probe_client, None
        if client is not None:
            close_client(client)

    def committer(self, group_id: str) -> Any:
        """The driver's long-lived consumer that commits offsets to ``group_id``."""
        if self.commit_client is None:
            self.commit_client = self.consumer(group_id=group_id, deadline=None)
        return self.commit_client

    def drop_committer(self) -> None:
        client, self.commit_client = self.commit_client, None
        if client is not None:
            close_client(client)

    def close(self) -> None:
        """Close the driver-side clients (the probe and the committer)."""
        self.drop_probe()
        self.drop_committer()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["probe_client"] = None
        state["commit_client"] = None
        return state

    def __repr__(self) -> str:
        settings = "<redacted>" if self.settings else "{}"
        return f"KafkaClients(bootstrap_servers={self.bootstrap_servers!r}, client_settings={settings})"


def is_transient(exc: BaseException) -> bool:
    """kafka-python's retriable errors: timeouts, lost connections, leaders moving."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, RetriableError

    return isinstance(exc, (KafkaTimeoutError, KafkaConnectionError, RetriableError))


def bounded(call: Any, timeout_s: float, what: str) -> Any:
    """``call()`` in a helper thread, waiting at most ``timeout_s``; :class:`SourceTimeout` after.

    On a timeout the thread is left to finish on its own (the caller drops the client, which
    ends the call).
    """
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            result["error"] = exc

    worker = threading.Thread(target=run, name="reclock-kafka-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise SourceTimeout(f"{what} did not answer within {timeout_s}s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def close_client(client: Any) -> None:
    """Close a client, best effort: a failure to close is only logged (at DEBUG)."""
    try:
        client.close(autocommit=False, timeout_ms=1000)
    except TypeError:
        client.close()
    except Exception as exc:  # closing is best effort
        log.debug("closing a kafka client failed: %s", describe(exc))

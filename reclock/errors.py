"""The exception hierarchy: one root, a few meaningful kinds.

Bad *data* is never an exception here (it is a value that flows to the errors table); these are for
configuration mistakes, definite source faults and fencing, so callers can tell "fix your config"
from "the source is broken for good" from "someone else owns this pipeline now".
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ConfigError",
    "ContractError",
    "DefiniteSourceError",
    "EngineUnavailable",
    "ErrorKind",
    "FencedError",
    "ReclockError",
    "StorageError",
    "TransientError",
    "classify",
    "describe",
]


class ReclockError(Exception):
    """Root of every error reclock raises on purpose."""


class ConfigError(ReclockError):
    """A pipeline definition is invalid; the message names the file and the field."""

    def __init__(self, field: str, message: str, *, file: str | None = None) -> None:
        self.field = field
        self.reason = message
        self.file = file
        where = f"{file}: " if file else ""
        super().__init__(f"{where}{field}: {message}")


class DefiniteSourceError(ReclockError):
    """The source can never make progress again as configured (topic deleted, offsets lost).

    Retrying does not help, so the pipeline fails instead of stalling.
    """


class EngineUnavailable(DefiniteSourceError):
    """The configured data plane cannot start (a Spark master that cannot be reached, a session
    that did not come up in ``[spark] start_timeout_seconds``).

    Definite like a lost source: the pipeline fails at once with one line naming the setting to
    fix, instead of retrying a batch whose every attempt would fail with the same Java text.
    """


class ContractError(ReclockError):
    """A source broke its contract (rows for an undeclared output, a read outside its split).

    A bug in the source, not bad data: the batch fails at once and is never skipped, because
    skipping would hide the bug behind a range of "bad records" that were never bad.
    """


class FencedError(ReclockError):
    """Another writer committed something this writer's view cannot adopt."""


class TransientError(ReclockError):
    """Infrastructure trouble that waiting can cure (a broker that does not answer, a timeout).

    The pipeline stalls and retries with backoff for as long as it lasts; it never counts against
    ``max_retries`` and never makes a batch skip data, because the data itself is fine.
    """


class StorageError(TransientError):
    """The lake's storage refused a read or write: a full disk, a read-only mount, lost permissions.

    Transient by definition: the data is fine and nothing partial is visible (a Delta commit lands
    whole or not at all), so the pipeline stalls with this message, which carries a hint for the
    operator, and goes on exactly where it was once the storage accepts writes again. It must never
    count as bad data, or a batch could be skipped because a disk was full.
    """


class ErrorKind(StrEnum):
    """How a failed task's error is handled: the pipeline's retry, skip and fail rules key on it."""

    TRANSIENT = "transient"  # stall and retry for as long as it lasts; never skip
    DATA = "data"  # retry the batch max_retries times, then fail or skip (stop_on_error)
    DEFINITE = "definite"  # the source can never go on: fail
    INVARIANT = "invariant"  # a bug or a broken contract: fail, never skip


def classify(exc: BaseException) -> ErrorKind:
    """The kind of an exception a task raised; anything unrecognised is a bad-data failure."""
    if isinstance(exc, TransientError):
        return ErrorKind.TRANSIENT
    if isinstance(exc, DefiniteSourceError):
        return ErrorKind.DEFINITE
    if isinstance(exc, (AssertionError, ContractError)):
        return ErrorKind.INVARIANT
    return ErrorKind.DATA


def describe(exc: BaseException) -> str:
    """``Type: message`` for status, logs and errors tables, with the type said once.

    Some libraries' messages already start with their type (kafka-python's ``str()`` of a
    ``KafkaTimeoutError`` is ``KafkaTimeoutError: Unable to bootstrap``).
    """
    name, text = type(exc).__name__, str(exc)
    return text if text == name or text.startswith(f"{name}: ") else f"{name}: {text}"

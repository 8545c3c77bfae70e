"""A definition's sections as frozen values, and the one typed parser that fills them.

Each TOML section a definition holds is a frozen dataclass here (``[pipeline]``, ``[spark]``,
``[lease]``) or in the runtime (:class:`~reclock.runtime.settings.Settings`,
:class:`~reclock.runtime.settings.Maintenance`). A field's annotation says what the key accepts
(``int`` is never a ``bool``, a ``float`` takes an ``int``, ``X | None`` takes ``X``, a
``Mapping`` is a table); its default says whether the key may be left out; the class's
``__post_init__`` checks the ranges and raises a :class:`~reclock.errors.ConfigError` naming the
field. :func:`parse_section` reads any of them, so a check is written once, where the field is.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from reclock.errors import ConfigError
from reclock.persist.lease import DEFAULT_TTL_S

__all__ = [
    "DEFAULT_SPARK_START_TIMEOUT_S",
    "LeaseSection",
    "PipelineSection",
    "SparkSection",
    "keys_of",
    "parse_section",
]

#: Seconds a job waits for its Spark session: a local one starts in 5-20 s on a loaded machine.
DEFAULT_SPARK_START_TIMEOUT_S = 120.0
ENGINES = ("spark", "local")
_MIN_TTL_S = 1.0  # renewals every third of it must fit the store's round trips
#: A field's metadata key: what a table it takes is of, for the error ("must be a table of ...").
TABLE_OF = "table of"

Fail = Callable[[str, str], ConfigError]
Section = TypeVar("Section")


@dataclass(frozen=True)
class PipelineSection:
    """``[pipeline]``'s own keys; the runtime's :class:`~reclock.runtime.settings.Settings` and
    ``on_record_error`` share the section."""

    name: str
    lake: str = "lake"
    engine: str = "spark"
    status_retention_days: float = 7.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not 0 < self.status_retention_days < math.inf:
            raise ConfigError(
                "status_retention_days", f"must be a finite number > 0, got {self.status_retention_days!r}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", "must be a port number (0 picks a free one)")
        if not self.metrics_host.strip():
            raise ConfigError("metrics_host", "must be an address to bind to, such as 127.0.0.1 or 0.0.0.0")
        if self.engine not in ENGINES:
            raise ConfigError("engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")


@dataclass(frozen=True)
class SparkSection:
    """``[spark]``: the session the job starts, and which batches go to it."""

    master: str = "local[2]"
    conf: Mapping[str, Any] = field(default_factory=dict, metadata={TABLE_OF: "Spark settings"})
    small_batch_offsets: int = 20_000
    background_start: bool = True
    start_timeout_seconds: float = DEFAULT_SPARK_START_TIMEOUT_S
    ui: bool = False

    def __post_init__(self) -> None:
        if self.small_batch_offsets < 0:
            raise ConfigError("small_batch_offsets", "must be >= 0 (0 sends every batch to Spark)")
        if not 0 < self.start_timeout_seconds < math.inf:
            raise ConfigError(
                "start_timeout_seconds", f"must be a finite number of seconds > 0, got {self.start_timeout_seconds!r}"
            )


@dataclass(frozen=True)
class LeaseSection:
    """``[lease]``: the job's lease in the lake, renewed every third of ``ttl_seconds``."""

    ttl_seconds: float = DEFAULT_TTL_S

    def __post_init__(self) -> None:
        if not _MIN_TTL_S <= self.ttl_seconds < math.inf:
            raise ConfigError(
                "ttl_seconds", f"must be a finite number of seconds >= {_MIN_TTL_S:g}, got {self.ttl_seconds!r}"
            )


def keys_of(cls: type) -> set[str]:
    """The keys a section of type ``cls`` takes."""
    return {f.name for f in fields(cls)}


def parse_section(cls: type[Section], section: Mapping[str, Any], prefix: str, fail: Fail) -> Section:
    """``section`` as a ``cls``, every key typed by its field's annotation (the module docstring).

    Keys ``cls`` has no field for are not looked at: the caller names the unknown ones first,
    against all the keys the section shares. An error names ``prefix`` and the field.
    """
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]  # cls is a dataclass, as every section is
        if f.name not in section:
            if f.default is MISSING and f.default_factory is MISSING:
                raise fail(f"{prefix}{f.name}", "missing")
            continue
        values[f.name] = _typed(section[f.name], _kind(hints[f.name]), f"{prefix}{f.name}", fail, f.metadata)
    try:
        return cls(**values)
    except ConfigError as exc:
        raise fail(f"{prefix}{exc.field}", exc.reason) from None


def _kind(hint: Any) -> type:
    """What a field's annotation accepts: ``X | None`` is ``X``; ``Mapping[...]`` is a table."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    origin = typing.get_origin(hint)
    if origin is not None and issubclass(origin, Mapping):
        return Mapping
    assert hint in _NAMES, f"a section field of a type the parser does not know: {hint!r}"
    return hint


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _typed(value: Any, kind: type, name: str, fail: Fail, metadata: Mapping[str, Any]) -> Any:
    if kind is Mapping:
        if not isinstance(value, Mapping):
            raise fail(name, f"must be a table of {metadata[TABLE_OF]}" if TABLE_OF in metadata else "must be a table")
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise fail(name, f"expected {_NAMES[kind]}, got {value!r}")
    return value

"""Options of the Postgres source, checked before the server is contacted.

``dsn`` (a libpq connection string; its password is never logged), ``tables`` (``schema.table``
names; a bare name is in ``public``; ``"*"``: every table of the publication, also those that
join it later, see :mod:`~reclock.sources.postgres.joining`), ``envelope`` (``upsert``, the default: each output mirrors
its table by primary key; ``append``: one change row per insert, update, delete or truncate),
``slot`` and ``publication`` (default ``reclock_<pipeline>``: one of each per pipeline),
``snapshot`` (take the initial copy of the tables, default true), ``snapshot_chunk_pages`` (the
heap pages one snapshot chunk covers), ``read_timeout_s`` (how long a read may see no progress
before it is a transient error), ``feedback_interval_s`` (the standby status update timer).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from reclock.envelope import APPEND, UPSERT, Envelope
from reclock.errors import ConfigError

__all__ = [
    "ENVELOPES",
    "WHOLE_PUBLICATION",
    "PostgresOptions",
    "TableName",
    "may_name_a_table",
    "output_name",
    "slot_name",
]

ENVELOPES = (UPSERT, APPEND)
#: A ``tables`` entry that names every table of the publication, those joining it later too.
WHOLE_PUBLICATION = "*"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, order=True)
class TableName:
    """A table of the publication: ``schema.name``, both plain identifiers."""

    schema: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def quoted(self) -> str:
        return f'"{self.schema}"."{self.name}"'

    @classmethod
    def parse(cls, text: object) -> TableName:
        if not isinstance(text, str):
            raise ConfigError("tables", f"a table is a 'schema.table' string, got {text!r}")
        schema, _, name = text.rpartition(".")
        schema = schema or "public"
        if not (_IDENT.match(schema) and _IDENT.match(name)):
            raise ConfigError("tables", f"{text!r} is not 'schema.table' of plain identifiers")
        return cls(schema, name)


def output_name(table: TableName) -> str:
    """The output a table lands in: ``<schema>_<table>`` (output names are identifiers)."""
    return f"{table.schema}_{table.name}"


_OUTPUT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*_[A-Za-z_][A-Za-z0-9_]*$")


def may_name_a_table(output: str) -> bool:
    """Whether ``output`` is :func:`output_name` of some table (``orders`` is not: no schema)."""
    return bool(_OUTPUT.match(output))


def slot_name(pipeline: str) -> str:
    """The default slot and publication name of a pipeline: ``reclock_<pipeline>``, lower case
    (slot names allow only lower-case letters, digits and underscores)."""
    return re.sub(r"[^a-z0-9_]", "_", f"reclock_{pipeline}".lower())[:63]


@dataclass(frozen=True)
class PostgresOptions:
    dsn: str
    tables: tuple[TableName, ...]
    envelope: Envelope
    slot: str
    publication: str
    snapshot: bool
    snapshot_chunk_pages: int
    read_timeout_s: float
    feedback_interval_s: float
    #: ``tables`` held ``"*"``: every table the publication has, now or later, is an output.
    whole_publication: bool = False

    @classmethod
    def check(
        cls,
        *,
        dsn: object,
        tables: object,
        envelope: object,
        slot: object,
        publication: object,
        snapshot: object,
        snapshot_chunk_pages: object,
        read_timeout_s: object,
        feedback_interval_s: object,
    ) -> PostgresOptions:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigError("dsn", "must be a libpq connection string ('host=... dbname=...')")
        if isinstance(tables, str) or not isinstance(tables, Sequence) or not tables:
            raise ConfigError(
                "tables", "must be a non-empty list of 'schema.table' names (or '*': the whole publication)"
            )
        whole = WHOLE_PUBLICATION in tables
        names = tuple(TableName.parse(t) for t in tables if t != WHOLE_PUBLICATION)
        if len(set(names)) != len(names):
            raise ConfigError("tables", "names a table twice")
        if envelope not in ENVELOPES:
            raise ConfigError("envelope", f"must be one of {', '.join(ENVELOPES)}, got {envelope!r}")
        for field, value in (("slot", slot), ("publication", publication)):
            if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9_]{1,63}", value):
                raise ConfigError(field, f"must be 1 to 63 lower-case letters, digits or '_', got {value!r}")
        if not isinstance(snapshot, bool):
            raise ConfigError("snapshot", f"must be true or false, got {snapshot!r}")
        if (
            not isinstance(snapshot_chunk_pages, int)
            or isinstance(snapshot_chunk_pages, bool)
            or snapshot_chunk_pages < 1
        ):
            raise ConfigError("snapshot_chunk_pages", f"must be an int >= 1, got {snapshot_chunk_pages!r}")
        for field, value in (("read_timeout_s", read_timeout_s), ("feedback_interval_s", feedback_interval_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(field, f"must be a number > 0, got {value!r}")
        return cls(
            dsn,
            names,
            envelope,  # type: ignore[arg-type]
            slot,  # type: ignore[arg-type]
            publication,  # type: ignore[arg-type]
            snapshot,
            snapshot_chunk_pages,
            float(read_timeout_s),  # type: ignore[arg-type]
            float(feedback_interval_s),  # type: ignore[arg-type]
            whole,
        )

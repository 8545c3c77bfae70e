"""Options of the MySQL source, checked before the server is contacted.

``host``, ``port``, ``user``, ``password`` (never logged, never in ``repr``) and ``database``
reach the server; ``tables`` are table names of that database, each an output named
``<database>_<table>``; ``envelope`` is ``upsert`` (each output mirrors its table by primary key,
the only one so far); ``server_id`` is the replica id the binlog reader registers with (unique
among the server's replicas; by default one derived from the pipeline's name); ``snapshot`` (take
the initial copy of the tables, default true), ``snapshot_chunk_rows`` (rows per snapshot chunk
file), ``read_timeout_s`` (how long a read may see nothing before it is a transient error).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from reclock.envelope import UPSERT, Envelope
from reclock.errors import ConfigError

__all__ = ["ENVELOPES", "MysqlOptions", "default_server_id", "output_name"]

ENVELOPES = (UPSERT,)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


def output_name(database: str, table: str) -> str:
    """The output a table lands in: ``<database>_<table>`` (output names are identifiers)."""
    return f"{database}_{table}"


def default_server_id(pipeline: str) -> int:
    """A pipeline's replica id: stable across its restarts (the server then sees one replica come
    back, not a new one), different for two pipelines, clear of the small ids servers use."""
    return 1_000_000 + zlib.crc32(pipeline.encode()) % 1_000_000_000


@dataclass(frozen=True)
class MysqlOptions:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    tables: tuple[str, ...]
    envelope: Envelope
    server_id: int
    snapshot: bool
    snapshot_chunk_rows: int
    read_timeout_s: float

    @classmethod
    def check(
        cls,
        *,
        host: object,
        port: object,
        user: object,
        password: object,
        database: object,
        tables: object,
        envelope: object,
        server_id: object,
        snapshot: object,
        snapshot_chunk_rows: object,
        read_timeout_s: object,
    ) -> MysqlOptions:
        for name, value in (("host", host), ("user", user)):
            if not isinstance(value, str) or not value:
                raise ConfigError(name, f"must be a non-empty string, got {value!r}")
        if not isinstance(password, str):
            raise ConfigError("password", "must be a string")
        if not isinstance(database, str) or not _IDENT.match(database):
            raise ConfigError("database", f"must be a database name (a plain identifier), got {database!r}")
        for name, value, low in (
            ("port", port, 1),
            ("server_id", server_id, 1),
            ("snapshot_chunk_rows", snapshot_chunk_rows, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(name, f"must be an int >= {low}, got {value!r}")
        if isinstance(tables, str) or not isinstance(tables, Sequence) or not tables:
            raise ConfigError("tables", "must be a non-empty list of table names of the database")
        for table in tables:
            if not isinstance(table, str) or not _IDENT.match(table):
                raise ConfigError("tables", f"{table!r} is not a table name (a plain identifier)")
        if len(set(tables)) != len(tables):
            raise ConfigError("tables", "names a table twice")
        if envelope not in ENVELOPES:
            raise ConfigError("envelope", f"must be one of {', '.join(ENVELOPES)}, got {envelope!r}")
        if not isinstance(snapshot, bool):
            raise ConfigError("snapshot", f"must be true or false, got {snapshot!r}")
        if not isinstance(read_timeout_s, (int, float)) or isinstance(read_timeout_s, bool) or read_timeout_s <= 0:
            raise ConfigError("read_timeout_s", f"must be a number > 0, got {read_timeout_s!r}")
        return cls(
            host,  # type: ignore[arg-type]
            port,  # type: ignore[arg-type]
            user,  # type: ignore[arg-type]
            password,
            database,
            tuple(tables),
            envelope,  # type: ignore[arg-type]
            server_id,  # type: ignore[arg-type]
            snapshot,
            snapshot_chunk_rows,  # type: ignore[arg-type]
            float(read_timeout_s),
        )

    def connection(self) -> dict[str, object]:
        """PyMySQL's connection keywords (the password among them: never log this)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "connect_timeout": max(1, int(self.read_timeout_s)),
            "read_timeout": self.read_timeout_s,
        }

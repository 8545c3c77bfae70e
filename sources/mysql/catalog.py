"""The server's settings, the user's privileges and the tables' columns, checked when the source is built.

A CDC reader of the binlog needs row events with every column of the row before and after
(``binlog_format = ROW``, ``binlog_row_image = FULL``) and the columns' names in them
(``binlog_row_metadata = FULL``, MariaDB 10.5+ and MySQL 8.0.1+): with names in every event, the
columns a change means come from the event itself, at its own position, never from the table's
definition now (the class of bug where a reader behind an ALTER TABLE decodes old events with new
columns). Each wrong setting is a :class:`~reclock.errors.DefiniteSourceError` naming it and the
statement that fixes it; so is a missing privilege; a table without a primary key is a
:class:`~reclock.errors.ConfigError` of ``tables`` with the ``ALTER TABLE`` to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from reclock.envelope import Envelope
from reclock.errors import ConfigError, DefiniteSourceError
from reclock.sources.base import Output
from reclock.sources.mysql.clients import PRIVILEGES
from reclock.sources.mysql.config import output_name

__all__ = ["REQUIRED", "TableSpec", "arrow_type", "check_privileges", "check_settings", "describe"]

#: The server settings the source needs, and the value each must have.
REQUIRED = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}


@dataclass(frozen=True)
class TableSpec:
    """One table as its output mirrors it: its columns (name, Arrow type) and primary key."""

    database: str
    table: str
    columns: tuple[tuple[str, pa.DataType], ...]
    key: tuple[str, ...]

    @property
    def output(self) -> str:
        return output_name(self.database, self.table)

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(name, kind) for name, kind in self.columns])

    def as_output(self, envelope: Envelope) -> Output:
        return Output(self.output, self.schema, self.key, envelope)


def check_settings(cursor: Any) -> None:
    """Each of :data:`REQUIRED` as the server has it, or a definite error naming the first wrong one."""
    for name, wanted in REQUIRED.items():
        cursor.execute(f"SELECT @@GLOBAL.{name}")
        value = cursor.fetchone()[0]
        have = {1: "ON", 0: "OFF"}.get(value, value) if name == "log_bin" else value
        if str(have).upper() != wanted:
            fix = f"SET GLOBAL {name} = '{wanted}'" if name != "log_bin" else "start the server with log_bin"
            raise DefiniteSourceError(
                f"the server's {name} is {have!r}, the MySQL source needs {wanted}: {fix} (and in the server's "
                "configuration, to keep it)"
            )


def check_privileges(cursor: Any, user: str) -> None:
    """The replication privileges in the user's grants (``SHOW GRANTS``), or a definite error naming
    the missing one and the ``GRANT`` to run. ``SELECT`` is checked table by table by :func:`describe`."""
    cursor.execute("SHOW GRANTS")
    grants = " ".join(row[0].upper() for row in cursor.fetchall())
    if "ALL PRIVILEGES ON *.*" in grants:
        return
    needs = {
        "REPLICATION SLAVE": ("REPLICATION SLAVE", "REPLICATION REPLICA"),
        "REPLICATION CLIENT": ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"),
    }
    for privilege, names in needs.items():
        if not any(name in grants for name in names):
            raise DefiniteSourceError(
                f"user {user} lacks the {privilege} privilege the MySQL source needs: "
                f"GRANT {PRIVILEGES} ON *.* TO '{user}'"
            )


def arrow_type(data_type: str, column_type: str, precision: int | None, scale: int | None) -> pa.DataType:
    """The Arrow type a column's values land as (``information_schema.COLUMNS``' words)."""
    unsigned = "unsigned" in column_type.lower()
    if data_type in ("tinyint", "smallint", "mediumint", "year"):
        return pa.int32()
    if data_type == "int":
        return pa.int64() if unsigned else pa.int32()
    if data_type == "bigint":
        return pa.uint64() if unsigned else pa.int64()
    if data_type == "bit":
        return pa.int64()
    if data_type == "decimal":
        return pa.decimal128(precision or 10, scale or 0)
    if data_type == "float":
        return pa.float32()
    if data_type == "double":
        return pa.float64()
    if data_type == "date":
        return pa.date32()
    if data_type in ("datetime", "timestamp"):
        return pa.timestamp("us")
    if data_type == "time":
        return pa.duration("us")
    if data_type in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return pa.binary()
    return pa.string()  # char, varchar, the texts, enum, set, json (a text on MariaDB)


def describe(cursor: Any, database: str, tables: Sequence[str], user: str) -> tuple[TableSpec, ...]:
    """The specs of ``tables``: a :class:`ConfigError` naming a missing table or one without a
    primary key (with the statement to run), a definite error where the user may not read one."""
    specs = []
    for table in tables:
        cursor.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, COLUMN_KEY "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
            (database, table),
        )
        rows = cursor.fetchall()
        if not rows:
            raise ConfigError("tables", f"table {database}.{table} does not exist (or user may not see it)")
        cursor.execute(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
            (database, table),
        )
        key = tuple(row[0] for row in cursor.fetchall())
        if not key:
            raise ConfigError(
                "tables",
                f"table {database}.{table} has no primary key to upsert by: add one "
                f"(ALTER TABLE `{database}`.`{table}` ADD PRIMARY KEY (...))",
            )
        try:
            cursor.execute(f"SELECT 1 FROM `{database}`.`{table}` LIMIT 0")
        except Exception as exc:
            if exc.args and exc.args[0] == 1142:
                raise DefiniteSourceError(
                    f"the user may not read table {database}.{table} (SELECT): GRANT {PRIVILEGES} ON *.* TO '{user}'"
                ) from None
            raise
        columns = tuple(
            (name, arrow_type(kind.lower(), column_type, precision, scale))
            for name, kind, column_type, precision, scale, _ in rows
        )
        specs.append(TableSpec(database, table, columns, key))
    return tuple(specs)

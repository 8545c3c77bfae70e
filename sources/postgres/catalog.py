"""What the server says about the source's tables: columns, types, keys, replica identity.

Read when the source is built (on the driver; a joining table at its copy, under the copy's
snapshot, :mod:`~reclock.sources.postgres.joining`), into picklable :class:`TableSpec` values that
travel to the readers: a reader checks every ``Relation`` message against its table's spec, so a
definition that changed under the pipeline is a definite error naming the table and the column
(dropped, or retyped to what the output cannot hold), never rows in the wrong columns; a column
added is an unknown field of its output (``schema_evolution``). The specs the outputs were made
for are kept in the source's state folder at the first start (:func:`pinned`): a later start
describes the tables as they are now, but its outputs, and the replay of WAL written before an
``ALTER TABLE``, stay those of the first. Here too the checks that make a server unusable, each one line saying what to
run: ``wal_level`` not ``logical``, a table missing, a table without a usable replica identity.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from reclock.envelope import APPEND, UPSERT
from reclock.errors import ConfigError, DefiniteSourceError
from reclock.sources.base import Output
from reclock.sources.postgres.columns import UNHELD, arrow_type, may_be_unheld
from reclock.sources.postgres.config import TableName, output_name
from reclock.sources.state import StateFolder

__all__ = [
    "CHANGE_COLUMNS",
    "ColumnSpec",
    "TableSpec",
    "check_wal_level",
    "describe",
    "ensure_publication",
    "pinned",
    "pinned_tables",
    "spec_json",
    "spec_of_json",
]

#: The file in the source's state folder holding the specs the outputs were made for.
TABLES = "tables.json"


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type_oid: int
    typmod: int

    @property
    def arrow(self) -> pa.DataType:
        return arrow_type(self.type_oid, self.typmod)


@dataclass(frozen=True)
class TableSpec:
    """One table of the publication as the source saw it when it was built."""

    table: TableName
    columns: tuple[ColumnSpec, ...]
    key: tuple[str, ...]  # the replica identity's columns (the primary key by default)
    identity: str  # pg_class.relreplident: d, n, f or i

    @property
    def output(self) -> str:
        return output_name(self.table)

    @property
    def unheld(self) -> bool:
        """Whether the table's rows carry :data:`~reclock.sources.postgres.columns.UNHELD`: a
        column of it can meet a value its Arrow type cannot hold (``NaN``, ``infinity``)."""
        return any(may_be_unheld(c.arrow) for c in self.columns)

    @property
    def row_schema(self) -> pa.Schema:
        """A row of the table as its output holds it: its columns, then ``_unheld`` if it may."""
        fields = [pa.field(c.name, c.arrow) for c in self.columns]
        return pa.schema([*fields, pa.field(UNHELD, pa.string())] if self.unheld else fields)

    def as_output(self, envelope: str) -> Output:
        """``upsert``: the table's own columns, keyed; ``append``: one change row per change."""
        if envelope == UPSERT:
            return Output(self.output, self.row_schema, key=self.key, envelope=UPSERT)
        row = pa.struct(list(self.row_schema))
        return Output(
            self.output,
            pa.schema([pa.field("before", row), pa.field("after", row), *CHANGE_COLUMNS]),
            envelope=APPEND,
        )


#: Columns of an ``append`` output besides ``before`` and ``after``: the operation (``c``reate,
#: ``u``pdate, ``d``elete, ``t``runcate), the transaction's commit LSN and id, and the change's
#: order inside its transaction (with ``_offset`` = commit LSN, it names the change).
CHANGE_COLUMNS = (
    pa.field("op", pa.string()),
    pa.field("commit_lsn", pa.int64()),
    pa.field("xid", pa.int64()),
    pa.field("seq", pa.int64()),
)


def check_wal_level(cursor: Any) -> None:
    cursor.execute("SHOW wal_level")
    level = cursor.fetchone()[0]
    if level != "logical":
        raise DefiniteSourceError(
            f"the server's wal_level is {level!r}: set wal_level = logical in postgresql.conf and restart the server"
        )


def describe(cursor: Any, tables: Sequence[TableName], envelope: str) -> tuple[TableSpec, ...]:
    """The specs of ``tables``; a :class:`ConfigError` naming the table and what to run when a
    table is missing or its changes could not be mirrored (no replica identity, no key)."""
    specs = []
    for table in tables:
        cursor.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (table.schema, table.name),
        )
        found = cursor.fetchone()
        if found is None:
            raise ConfigError("tables", f"table {table.qualified} does not exist")
        oid, identity = found
        cursor.execute(
            "SELECT attname, atttypid, atttypmod FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (oid,),
        )
        columns = tuple(ColumnSpec(name, int(type_oid), int(typmod)) for name, type_oid, typmod in cursor.fetchall())
        index = {"d": "i.indisprimary", "i": "i.indisreplident", "f": "i.indisprimary"}.get(identity)
        key: tuple[str, ...] = ()
        if index is not None:
            cursor.execute(
                "SELECT a.attname FROM pg_index i "
                "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                f"WHERE i.indrelid = %s AND {index} ORDER BY k.n",
                (oid,),
            )
            key = tuple(row[0] for row in cursor.fetchall())
        if identity == "n" or (identity in ("d", "i") and not key):
            raise ConfigError(
                "tables",
                f"table {table.qualified} has no usable replica identity (its updates and deletes do not say which "
                f"row they change): run ALTER TABLE {table.quoted} REPLICA IDENTITY FULL, or give it a primary key",
            )
        if envelope == UPSERT and not key:
            raise ConfigError(
                "tables",
                f"table {table.qualified} has no primary key to upsert by: add one (ALTER TABLE {table.quoted} "
                "ADD PRIMARY KEY (...)), or use envelope = 'append'",
            )
        specs.append(TableSpec(table, columns, key, identity))
    return tuple(specs)


def ensure_publication(cursor: Any, publication: str, tables: Sequence[TableName]) -> None:
    """Create ``publication`` for ``tables``, or add to it those it lacks (it may publish others).
    With no ``tables`` (a definition of the whole publication, ``"*"``) a publication made here
    publishes nothing until tables are added to it (``ALTER PUBLICATION ... ADD TABLE``)."""
    cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
    if cursor.fetchone() is None:
        listed = f" FOR TABLE {', '.join(t.quoted for t in tables)}" if tables else ""
        cursor.execute(f'CREATE PUBLICATION "{publication}"{listed}')
        return
    if not tables:
        return
    cursor.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
    published = {TableName(s, n) for s, n in cursor.fetchall()}
    missing = [t for t in tables if t not in published]
    if missing:
        cursor.execute(f'ALTER PUBLICATION "{publication}" ADD TABLE {", ".join(t.quoted for t in missing)}')


def pinned(state: StateFolder | None, specs: Sequence[TableSpec]) -> tuple[TableSpec, ...]:
    """The specs the pipeline's outputs were made for: those ``state`` keeps, or ``specs`` (the
    tables as they are now), kept there from now on. Without a state folder (``reclock create``
    checks a definition) ``specs`` as they are. The folder is the lake's (local or object
    storage), so a restart anywhere replays old WAL against the columns it was written for."""
    if state is None:
        return tuple(specs)
    text = state.read_text(TABLES)
    if text is None:
        state.write_bytes(TABLES, json.dumps([spec_json(spec) for spec in specs]).encode())
        return tuple(specs)
    made = {spec.table: spec for spec in map(spec_of_json, json.loads(text))}
    return tuple(made.get(spec.table, spec) for spec in specs)


def pinned_tables(state: StateFolder | None) -> frozenset[TableName] | None:
    """The tables whose specs ``state`` keeps (those of the first start), ``None`` before one."""
    text = None if state is None else state.read_text(TABLES)
    return None if text is None else frozenset(spec_of_json(item).table for item in json.loads(text))


def spec_of_json(item: dict[str, Any]) -> TableSpec:
    """A spec as :func:`spec_json` wrote it."""
    table = TableName(*item["table"])
    columns = tuple(ColumnSpec(*c) for c in item["columns"])
    return TableSpec(table, columns, tuple(item["key"]), item["identity"])


def spec_json(spec: TableSpec) -> dict[str, Any]:
    """A spec as kept in the state folder (``tables.json``, a joined table's manifest)."""
    return {
        "table": [spec.table.schema, spec.table.name],
        "columns": [[c.name, c.type_oid, c.typmod] for c in spec.columns],
        "key": list(spec.key),
        "identity": spec.identity,
    }

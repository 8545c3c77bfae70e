"""An outside reader of Delta tables for acceptance tests: the ``_delta_log`` JSON replayed by
hand and the data files read with pyarrow, sharing no code with reclock or delta-rs's reader.

It follows the protocol's plain parts only (JSON commits, no checkpoints, no deletion vectors),
which is all the tables these tests write use.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass
class LogState:
    """A table's state after replaying its log: live files, schema, partitioning and labels."""

    root: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> add action
    schema: list[dict[str, Any]] = field(default_factory=list)  # Delta schema fields
    partition_columns: list[str] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # app id -> txn version
    commits: list[list[dict[str, Any]]] = field(default_factory=list)  # actions of each version

    @property
    def column_names(self) -> list[str]:
        return [f["name"] for f in self.schema]

    def rows(self) -> list[dict[str, Any]]:
        """Every live row: a file's columns, plus its partition values as the log's text."""
        out = []
        for path, add in self.files.items():
            table = pq.read_table(self.root / urllib.parse.unquote(path))
            for row in table.to_pylist():
                row.update(add.get("partitionValues") or {})
                for name in self.column_names:
                    row.setdefault(name, None)
                out.append(row)
        return out


def replay(table_root: str | Path, *, version: int | None = None) -> LogState:
    """Replay ``_delta_log/*.json`` up to ``version`` (all by default)."""
    root = Path(table_root)
    state = LogState(root)
    entries = sorted((root / "_delta_log").glob("*.json"))
    for entry in entries:
        if version is not None and int(entry.stem) > version:
            break
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        state.commits.append(actions)
        for action in actions:
            if "add" in action:
                state.files[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                state.files.pop(action["remove"]["path"], None)
            elif "metaData" in action:
                state.schema = json.loads(action["metaData"]["schemaString"])["fields"]
                state.partition_columns = action["metaData"]["partitionColumns"]
            elif "txn" in action:
                state.labels[action["txn"]["appId"]] = action["txn"]["version"]
    return state


#: The Arrow type each Delta primitive type is written as, by every writer of a table alike.
_PRIMITIVES = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def arrow_type(delta: Any) -> pa.DataType:
    """The one Arrow type a Delta schema type is held in (the protocol's JSON form)."""
    if isinstance(delta, str):
        if delta.startswith("decimal("):
            precision, scale = delta[len("decimal(") : -1].split(",")
            return pa.decimal128(int(precision), int(scale))
        return _PRIMITIVES[delta]
    if delta["type"] == "struct":
        return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in delta["fields"]])
    if delta["type"] == "array":
        return pa.list_(pa.field("element", arrow_type(delta["elementType"])))
    if delta["type"] == "map":
        return pa.map_(arrow_type(delta["keyType"]), arrow_type(delta["valueType"]))
    raise AssertionError(f"a Delta type this reader does not know: {delta!r}")


def _plain(kind: pa.DataType) -> pa.DataType:
    """``kind`` without its field names and nullability, for comparing types alone."""
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(kind.field(i).name, _plain(kind.field(i).type)) for i in range(kind.num_fields)])
    if pa.types.is_list(kind):
        return pa.list_(pa.field("element", _plain(kind.value_type)))
    if pa.types.is_map(kind):
        return pa.map_(_plain(kind.key_type), _plain(kind.item_type))
    return kind


def file_schema_mismatches(table_root: str | Path) -> list[str]:
    """Every live data file of the table whose columns, read by pyarrow from the file alone, are
    not of the Arrow types of the table's schema (its log's ``metaData``): one physical type per
    column per table, whichever writer wrote the file. A file may lack a column added after it
    was written; it holds no column the table lacks, and no partition column."""
    state = replay(table_root)
    want = {f["name"]: arrow_type(f["type"]) for f in state.schema if f["name"] not in state.partition_columns}
    problems = []
    for path in sorted(state.files):
        schema = pq.read_schema(state.root / urllib.parse.unquote(path))
        for f in schema:
            if f.name not in want:
                problems.append(f"{path}: column {f.name} ({f.type}) is not a column of the table")
            elif _plain(f.type) != want[f.name]:
                problems.append(f"{path}: column {f.name} is {f.type}, the table's type is {want[f.name]}")
    return problems


def lake_file_schema_mismatches(lake: str | Path) -> list[str]:
    """:func:`file_schema_mismatches` of every output table under a lake folder (any depth)."""
    problems = []
    for log in sorted(Path(lake).rglob("_delta_log")):
        problems += [f"{log.parent.name}: {p}" for p in file_schema_mismatches(log.parent)]
    return problems

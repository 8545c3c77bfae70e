"""Options of a files source, checked when the pipeline is defined.

A bad option fails at definition with a :class:`~reclock.errors.ConfigError` naming the field,
never later on a batch: the path must be an existing directory (or a glob under one), the
columns must use the type names of :data:`COLUMN_TYPES` and none of reclock's lineage names.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypeAlias

import pyarrow as pa

from reclock.errors import ConfigError
from reclock.sources.base import LINEAGE_FIELDS

__all__ = [
    "COLUMN_TYPES",
    "FORMATS",
    "RESERVED",
    "UTC",
    "FileFormat",
    "check_char",
    "check_columns",
    "check_path",
]

FileFormat: TypeAlias = Literal["csv", "jsonl", "parquet"]
FORMATS: tuple[str, ...] = ("csv", "jsonl", "parquet")

#: The Arrow type of a ``timestamp`` column: microseconds, UTC.
UTC = pa.timestamp("us", tz="UTC")

#: The column type names ``columns`` accepts, and the Arrow type each one lands as.
COLUMN_TYPES: Mapping[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "timestamp": UTC,
    "date": pa.date32(),
}

#: Column names reclock adds to every batch; a file's own columns may not use them.
RESERVED = frozenset(f.name for f in LINEAGE_FIELDS)


def check_path(path: object) -> tuple[str, str | None]:
    """``(root directory, glob pattern or None)``, both absolute; the root must exist."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ConfigError("path", f"must be a directory or a glob pattern, got {path!r}")
    text = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if glob.has_magic(text):
        parts = Path(text).parts
        fixed = []
        for part in parts:
            if glob.has_magic(part):
                break
            fixed.append(part)
        root = str(Path(*fixed))
        if not os.path.isdir(root):
            raise ConfigError("path", f"the glob's directory {root} does not exist")
        return root, text
    if not os.path.isdir(text):
        what = "is a file, not a directory (use a glob to pick files)" if os.path.exists(text) else "does not exist"
        raise ConfigError("path", f"{text} {what}")
    return text, None


def check_char(field: str, value: object) -> str:
    """A CSV delimiter or quote: one ASCII character that is not a line end."""
    if not isinstance(value, str) or len(value) != 1 or not value.isascii() or value in "\r\n":
        raise ConfigError(field, f"must be one ASCII character other than a line end, got {value!r}")
    return value


def check_columns(columns: object) -> pa.Schema:
    """The output schema ``columns`` declares: ``{name: type name}``, in order."""
    if not isinstance(columns, Mapping) or not columns:
        raise ConfigError("columns", f"must map column names to type names, got {columns!r}")
    fields = []
    for name, type_name in columns.items():
        if not isinstance(name, str) or not name:
            raise ConfigError("columns", f"column names must be non-empty strings, got {name!r}")
        if name in RESERVED:
            raise ConfigError(f"columns.{name}", "is reserved for reclock's lineage columns")
        if type_name not in COLUMN_TYPES:
            raise ConfigError(
                f"columns.{name}", f"unknown type {type_name!r}; expected one of {', '.join(COLUMN_TYPES)}"
            )
        fields.append(pa.field(name, COLUMN_TYPES[type_name]))
    return pa.schema(fields)

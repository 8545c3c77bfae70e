"""Parquet: row counts from the footer, the schema of the first file, rows cast to the columns.

A Parquet file's offsets are row indices and its upper is its row count from the footer, so
probing reads no data. Reading casts each declared column (one the file lacks is all null); a
value that does not fit its column (``convert``, see :mod:`reclock.sources.files.convert`) makes its row
bad, alone. A file whose row count is not the one it was bound with was replaced after it was
bound and cannot be replayed: its read raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from reclock.errors import ConfigError
from reclock.sources.files.config import RESERVED
from reclock.sources.files.convert import convert, convert_all
from reclock.sources.files.listing import Listed
from reclock.sources.files.store import FileStore

__all__ = ["ParquetRows", "first_schema", "footer_rows", "read_rows", "row_json"]


class ParquetRows(NamedTuple):
    """``num_rows`` rows of a file from row ``offset`` on, cast to the declared columns.

    ``bad`` maps a row (counted from ``offset``) to the problem of its first column that did not
    fit; its values are null in ``columns``. ``batch`` holds the rows as read, for the raw
    content of bad rows (``None`` when the file has none of the declared columns).
    """

    offset: int
    num_rows: int  # not ``count``: a tuple's own method of that name would be shadowed
    columns: list[pa.Array]
    bad: dict[int, str]
    batch: pa.RecordBatch | None


def footer_rows(path: str, store: FileStore | None = None) -> int:
    """The row count in the footer of the Parquet file at ``path`` (no data is read)."""
    with _store(store).open(path) as (handle, _):
        return pq.read_metadata(handle).num_rows


def first_schema(listed: Sequence[Listed], where: str, store: FileStore | None = None) -> pa.Schema:
    """The schema of the first readable Parquet file of ``listed``, all fields nullable.

    Called when a source's ``columns`` are left out; ``where`` names the source in the error
    raised when no file can give a schema yet.
    """
    for f in listed:
        if f.format != "parquet" or f.size == 0:
            continue
        try:
            with _store(store).open(f.path) as (handle, _):
                schema = pq.read_schema(handle)
        except (OSError, ValueError, pa.ArrowException):
            continue
        fields = []
        for field in schema:
            if field.name in RESERVED:
                raise ConfigError("columns", f"{f.path} has a column named {field.name!r}, which reclock reserves")
            fields.append(pa.field(field.name, field.type))
        return pa.schema(fields)
    raise ConfigError("columns", f"no readable Parquet file under {where} yet to take the schema from; declare columns")


def read_rows(
    path: str, end: int, schema: pa.Schema, batch_rows: int, store: FileStore | None = None
) -> Iterator[ParquetRows]:
    """Rows ``[0, end)`` of the file at ``path``, ``batch_rows`` at a time, cast to ``schema``."""
    with _store(store).open(path) as (f, _):
        parquet = pq.ParquetFile(f)
        rows = parquet.metadata.num_rows
        if rows != end:
            raise ValueError(
                f"{path} has {rows} rows but was bound with {end}: it was replaced after it was "
                "bound and cannot be read again; drop it to re-ingest"
            )
        present = set(parquet.schema_arrow.names)
        wanted = [name for name in schema.names if name in present]
        offset = 0
        if not wanted:  # none of the declared columns: every row is all nulls
            for start in range(0, rows, batch_rows):
                n = min(batch_rows, rows - start)
                yield ParquetRows(start, n, [pa.nulls(n, f.type) for f in schema], {}, None)
            return
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted, use_threads=False):
            columns, bad = _cast(batch, schema, path)
            yield ParquetRows(offset, batch.num_rows, columns, bad, batch)
            offset += batch.num_rows
        if offset != rows:
            raise ValueError(f"{path} yielded {offset} rows, its footer says {rows}")


def row_json(batch: pa.RecordBatch, i: int) -> bytes:
    """Row ``i`` of ``batch`` as JSON text: the raw content of a bad Parquet row."""
    return json.dumps(batch.slice(i, 1).to_pylist()[0], default=str).encode()


def _cast(batch: pa.RecordBatch, schema: pa.Schema, path: str) -> tuple[list[pa.Array], dict[int, str]]:
    """One Parquet batch as the declared columns; ``{row: problem}`` of values that do not fit."""
    n = batch.num_rows
    names = set(batch.schema.names)
    columns: list[pa.Array] = []
    bad: dict[int, str] = {}
    for f in schema:
        if f.name not in names:
            columns.append(pa.nulls(n, f.type))
            continue
        column = batch.column(f.name)
        try:
            converted, problems = convert_all(column, f.type, convert)
        except pa.ArrowNotImplementedError as exc:
            raise TypeError(f"{path}: column {f.name!r} of type {column.type} cannot become {f.type}: {exc}") from exc
        columns.append(converted)
        for i, problem in problems.items():
            bad.setdefault(i, f"column {f.name!r}: {problem}")
    return columns, bad


def _store(store: FileStore | None) -> FileStore:
    """The store files are opened through: a local one when none is given (its root is unused)."""
    return store if store is not None else FileStore("")

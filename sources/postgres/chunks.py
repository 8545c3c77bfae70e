"""A captured snapshot chunk as its output's Arrow batch, column by column.

A chunk (:mod:`~reclock.sources.postgres.snapshot`) holds one table's rows as ``COPY`` sent
them, typed by its capture task when every value of it types (:func:`typed_chunk`), else as the
texts themselves. Landed, it must give the very rows and errors the stream's path
would give for the same rows as one transaction of ``r`` changes at the chunk's offset
(:class:`~reclock.sources.postgres.changes.ChangeBatches`; a unit test pins the two equal), but
none of that path's per-row work applies: a chunk has no update, no delete, no TOAST value left
unsent and no column added since the output was made, and its keys are distinct (a snapshot holds
a key once, and an ``upsert`` output's key is the table's primary key or replica identity index).
So each text column is typed at once by the conversion the stream uses
(:func:`~reclock.sources.postgres.columns.typed_texts`), in the capture task or else here, and
the envelope's columns are arrays made whole:

* ``upsert``: ``_partition``, ``_offset`` (the chunk's index), the table's columns (``_unheld``
  included), ``_deleted`` and ``_truncated`` (all false), ``_unsent`` (null);
* ``append``: ``_partition``, ``_offset``, ``before`` (null), ``after`` (the row), ``op`` (``r``),
  ``commit_lsn`` (the slot's consistent point), ``xid`` (null) and ``seq`` (the row's place in
  the chunk);
* ``_unknown_fields`` (null) for an output that keeps unknown fields.

A value its column's type cannot hold is null there and kept as text in the row's ``_unheld``,
as the stream's path keeps it; a row with a value no column holds goes to ``_errors`` at the
chunk's offset with the same kind, message and raw JSON as the stream's path gives it (or raises
:class:`~reclock.sources.base.RecordError` under ``fail``); the chunk's other rows land.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator

import numpy as np
import pyarrow as pa

from reclock.envelope import UPSERT
from reclock.sources.base import ERRORS, RecordError, error_batch
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.changes import DELETED, TRUNCATED, UNSENT
from reclock.sources.postgres.columns import may_be_unheld, typed_texts, unheld_texts
from reclock.timeline.frontier import OFFSET, PARTITION, UNKNOWN_FIELDS

__all__ = ["chunk_batches", "typed_chunk", "whole"]

#: A snapshot row's operation, as the stream's path names it (``Change.op``).
READ = "r"


def typed_chunk(rows: pa.Table, spec: TableSpec) -> pa.Table:
    """What a capture task keeps of a chunk's text ``rows``: every column typed as its output's
    (:func:`~reclock.sources.postgres.columns.typed_texts`) if every value of the chunk types,
    else the texts as they are. A chunk with a bad value is typed when it is read, where the
    bad value's row goes to ``_errors`` with every column's text, as the stream's path words it;
    a typed chunk is smaller, and reads back without a cast."""
    typed = []
    for column, raw in zip(spec.columns, rows.columns, strict=True):
        array, bad = typed_texts(whole(raw), column.arrow)
        if bad:
            return rows
        typed.append(array)
    return pa.Table.from_arrays(typed, names=[c.name for c in spec.columns])


def whole(column: pa.ChunkedArray) -> pa.Array:
    """``column`` as one array: its one chunk as it is (``combine_chunks`` copies even that:
    twice every value of a snapshot, 0.11 CPU-s of 2,000,000 rows), else its chunks joined."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def chunk_batches(
    rows: pa.Table,
    spec: TableSpec,
    envelope: str,
    partition: str,
    offset: int,
    lsn: int,
    *,
    fail: bool = False,
    unknown: Collection[str] = (),
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The ``(output, batch)`` pairs of chunk ``rows`` (in ``spec``'s column order: typed as its
    output's columns, or texts, see :func:`typed_chunk`) of ``spec``'s output, at source time
    ``offset``; ``lsn`` is the slot's consistent point. The output's batch first, then its
    ``_errors`` rows if any value could not be typed."""
    n = rows.num_rows
    texts = [whole(rows.column(j)) for j in range(len(spec.columns))]
    typed: list[pa.Array] = []
    wrong: dict[int, tuple[str, str]] = {}
    if all(array.type == column.arrow for array, column in zip(texts, spec.columns, strict=True)):
        typed = [*texts]  # typed by the capture, which types a chunk only if every value types
        if spec.unheld:
            typed.append(pa.nulls(n, pa.string()))
    else:  # texts (some columns typed by the parser, whose text forms cast back as they were)
        texts = [raw.cast(pa.string()) for raw in texts]
        unheld: list[list[int]] = []
        for column, raw in zip(spec.columns, texts, strict=True):
            array, bad = typed_texts(raw, column.arrow)
            typed.append(array)
            rescued = spec.unheld and may_be_unheld(column.arrow)
            unheld.append(bad if rescued else [])
            for i in [] if rescued else bad:
                wrong.setdefault(i, (column.name, raw[i].as_py()))
        if spec.unheld:
            typed.append(unheld_texts([c.name for c in spec.columns], texts, unheld, n))
    errors = _rejected(spec, texts, wrong, partition, offset, fail)
    keep = None
    if wrong:
        mask = np.ones(n, dtype=bool)
        mask[sorted(wrong)] = False
        keep = pa.array(mask)
        typed = [array.filter(keep) for array in typed]
    kept = n - len(wrong)
    seqs = np.arange(n, dtype=np.int64) if keep is None else np.flatnonzero(keep.to_numpy(zero_copy_only=False))
    lineage = [
        pa.repeat(pa.scalar(partition, pa.string()), kept),
        pa.array(np.full(kept, offset, dtype=np.int64)),
    ]
    if envelope == UPSERT:
        falses = pa.array(np.zeros(kept, dtype=bool))
        arrays = [*lineage, *typed, falses, falses, pa.nulls(kept, pa.list_(pa.string()))]
        names = [PARTITION, OFFSET, *spec.row_schema.names, DELETED, TRUNCATED, UNSENT]
    else:
        fields = list(spec.row_schema)
        befores = [pa.nulls(kept, f.type) for f in fields]
        arrays = [
            *lineage,
            pa.StructArray.from_arrays(befores, fields=fields, mask=pa.array(np.ones(kept, dtype=bool))),
            pa.StructArray.from_arrays(typed, fields=fields, mask=pa.array(np.zeros(kept, dtype=bool))),
            pa.repeat(pa.scalar(READ, pa.string()), kept),
            pa.array(np.full(kept, lsn, dtype=np.int64)),
            pa.nulls(kept, pa.int64()),
            pa.array(seqs),
        ]
        names = [PARTITION, OFFSET, "before", "after", "op", "commit_lsn", "xid", "seq"]
    if spec.output in unknown:
        arrays.append(pa.nulls(kept, pa.string()))
        names.append(UNKNOWN_FIELDS)
    yield spec.output, pa.RecordBatch.from_arrays(arrays, names=names)
    if errors is not None:
        yield ERRORS, errors


def _rejected(
    spec: TableSpec, texts: list[pa.Array], wrong: dict[int, tuple[str, str]], partition: str, offset: int, fail: bool
) -> pa.RecordBatch | None:
    """The ``_errors`` rows of the chunk's rows ``wrong`` names (with the column and the value no
    column holds), as the stream's path words them."""
    if not wrong:
        return None
    messages = [
        f"table {spec.table.qualified}: column {column} cannot hold the value {text!r}"
        for column, text in (wrong[i] for i in sorted(wrong))
    ]
    if fail:
        raise RecordError(f"{messages[0]} (commit LSN {offset})")
    raws = []
    for i in sorted(wrong):
        raw = {
            "table": spec.table.qualified,
            "op": READ,
            "xid": None,
            "seq": i,
            "old": None,
            "new": [column[i].as_py() for column in texts],
        }
        raws.append(json.dumps(raw).encode())
    n = len(wrong)
    return error_batch(partition, [offset] * n, ["decode"] * n, messages, raws)

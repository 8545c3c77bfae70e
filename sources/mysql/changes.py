"""Row changes of committed transactions (and snapshot rows) as the Arrow batches of their outputs.

A reader hands :func:`upsert_batch` a table's changes in binlog order, each a :class:`Change`
at its transaction's offset (:mod:`~reclock.sources.mysql.position`), or a snapshot chunk's rows
at the chunk's offset. An ``upsert`` output's batch has ``_partition``, ``_offset``, the table's
columns and an explicit ``_deleted``. Within one transaction only the last change of a key is
kept (its changes share one ``_offset``, and the upsert keeps the latest offset per key, so two
rows of one key at one offset would leave the winner to chance); an update that changes the key
deletes the old key.

A change's columns are the row event's own, named by the event (``binlog_row_metadata = FULL``),
so a change written before an ``ALTER TABLE`` means the columns it had then:

* a column the output has and the change lacks (dropped on the server) is a
  :class:`~reclock.errors.DefiniteSourceError` naming the table and the column: the output can
  no longer mirror it;
* a column the change has and the output lacks (added since the output was made) goes on as the
  record's unknown fields (one JSON object of text values) for an output that evolves its schema
  (``schema_evolution``), and is left out by the others.

A value its column's Arrow type cannot hold sends that change to ``_errors`` at its coordinates,
naming the table, the column and the value (or raises :class:`~reclock.sources.base.RecordError`
under ``on_record_error = "fail"``); the batch's other changes land.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import pyarrow as pa

from reclock.errors import DefiniteSourceError
from reclock.sources.base import ERRORS, RecordError, error_batch
from reclock.sources.mysql.catalog import TableSpec
from reclock.timeline.frontier import OFFSET, PARTITION, UNKNOWN_FIELDS

__all__ = ["DELETED", "Change", "last_per_key", "plain_value", "upsert_batch"]

DELETED = "_deleted"


class Change(NamedTuple):
    """One change of a table at ``offset``: the row's values by column name, and whether it deletes it."""

    offset: int
    deleted: bool
    row: dict[str, Any]


def last_per_key(
    spec: TableSpec, changes: Sequence[tuple[dict[str, Any] | None, dict[str, Any] | None]], offset: int
) -> list[Change]:
    """One transaction's changes of ``spec``'s table, ``(before, after)`` each (``before`` None: an
    insert; ``after`` None: a delete), as the last change per key, in the order of those last changes."""
    kept: dict[tuple, Change] = {}
    for before, after in changes:
        if before is not None:
            old = tuple(before.get(k) for k in spec.key)
            if after is None or old != tuple(after.get(k) for k in spec.key):
                kept.pop(old, None)
                kept[old] = Change(offset, True, before)
        if after is not None:
            new = tuple(after.get(k) for k in spec.key)
            kept.pop(new, None)
            kept[new] = Change(offset, False, after)
    return list(kept.values())


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def plain_value(value: Any, kind: pa.DataType) -> Any:
    """A value as Arrow takes it for ``kind``: texts the client left as bytes decoded, a SET's
    members joined as the server writes them, a BIT's bytes as its number."""
    if value is None:
        return None
    if pa.types.is_string(kind):
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        if isinstance(value, (set, frozenset)):
            return ",".join(sorted(value))
        return value if isinstance(value, str) else str(value)
    if pa.types.is_integer(kind) and isinstance(value, bytes):
        return int.from_bytes(value, "big")
    if pa.types.is_decimal(kind) and not isinstance(value, Decimal):
        return Decimal(str(value))
    return value


def upsert_batch(
    spec: TableSpec,
    partition: str,
    changes: Sequence[Change],
    *,
    unknown: bool,
    fail: bool,
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``changes`` of ``spec``'s table as one batch of its output (and one of ``_errors`` for the
    changes a value of which cannot be held; see the module docstring)."""
    names = [name for name, _ in spec.columns]
    known = set(names)
    for change in changes:
        missing = [name for name in names if name not in change.row]
        if missing:
            raise DefiniteSourceError(
                f"table {spec.database}.{spec.table} no longer has column {missing[0]} (a DROP or RENAME COLUMN): "
                f"output {spec.output} cannot mirror it; recreate the pipeline"
            )
    good, bad = list(changes), []
    try:
        arrays = _arrays(spec, good)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        # Some value does not fit its column: find the changes that hold one, the rest land.
        good = []
        for change in changes:
            column = next((n for n, k in spec.columns if not _holds(change.row[n], k)), None)
            if column is None:
                good.append(change)
                continue
            message = (
                f"table {spec.database}.{spec.table} column {column}: value {change.row[column]!r} "
                f"does not fit its type {dict(spec.columns)[column]}"
            )
            if fail:
                raise RecordError(message) from None
            bad.append((change, message))
        arrays = _arrays(spec, good)
    if good:
        arrays = [
            pa.array([partition] * len(good), pa.string()),
            pa.array([c.offset for c in good], pa.int64()),
            *arrays,
            pa.array([c.deleted for c in good], pa.bool_()),
        ]
        fields = [
            pa.field(PARTITION, pa.string()),
            pa.field(OFFSET, pa.int64()),
            *spec.schema,
            pa.field(DELETED, pa.bool_()),
        ]
        if unknown:
            extra = [
                json.dumps({k: _text(v) for k, v in c.row.items() if k not in known})
                if len(c.row) > len(known)
                else None
                for c in good
            ]
            arrays.append(pa.array(extra, pa.string()))
            fields.append(pa.field(UNKNOWN_FIELDS, pa.string()))
        yield spec.output, pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
    if bad:
        yield (
            ERRORS,
            error_batch(
                partition,
                [c.offset for c, _ in bad],
                ["value"] * len(bad),
                [m for _, m in bad],
                [json.dumps({k: _text(v) for k, v in c.row.items()}).encode() for c, _ in bad],
            ),
        )


def _arrays(spec: TableSpec, changes: Sequence[Change]) -> list[pa.Array]:
    return [pa.array([plain_value(c.row[name], kind) for c in changes], kind) for name, kind in spec.columns]


def _holds(value: Any, kind: pa.DataType) -> bool:
    try:
        pa.array([plain_value(value, kind)], kind)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return False
    return True

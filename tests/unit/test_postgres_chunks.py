"""A snapshot chunk landed column by column gives exactly what the stream's per-change path gives.

The oracle is :class:`~reclock.sources.postgres.changes.ChangeBatches` fed the chunk's rows as one
transaction of ``r`` changes at the chunk's offset (what the source did before the columnar path):
same output rows, same schema, same ``_errors`` rows, same ``fail``, for both envelopes, whether
the chunk is read as its texts or as its capture task keeps it (typed if every value types, in a
parquet file).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sources.base import ERRORS, RecordError
from reclock.sources.postgres.catalog import ColumnSpec, TableSpec
from reclock.sources.postgres.changes import Change, ChangeBatches
from reclock.sources.postgres.chunks import chunk_batches, typed_chunk
from reclock.sources.postgres.config import TableName

PARTITION = "wal"
OFFSET, LSN = 3, 0x1_6B37_48A0

#: One column of each kind the conversion treats apart: integers, text, decimal, boolean, float,
#: date, timestamptz, bytea, and a type kept as its text (uuid).
SPEC = TableSpec(
    TableName("public", "t"),
    (
        ColumnSpec("id", 20, -1),
        ColumnSpec("name", 25, -1),
        ColumnSpec("amount", 1700, ((10 << 16) | 2) + 4),
        ColumnSpec("ok", 16, -1),
        ColumnSpec("score", 701, -1),
        ColumnSpec("day", 1082, -1),
        ColumnSpec("at", 1184, -1),
        ColumnSpec("blob", 17, -1),
        ColumnSpec("ref", 2950, -1),
        ColumnSpec("small", 23, -1),
    ),
    key=("id",),
    identity="d",
)

#: Per column: texts COPY sends for values of it, and texts its type cannot hold.
GOOD = [
    None,
    ["ä ö", "", "a,b", '"quoted"', "line\nbreak"],
    ["0.00", "-12.50", "99999999.99"],
    ["t", "f"],
    ["0", "1.5", "-2.25e-05", "NaN", "Infinity"],
    ["2026-11-27", "1999-01-01"],
    ["2026-11-27 10:00:00.123456+00", "1970-01-01 00:00:00+00"],
    ["\\x", "\\x00ff10"],
    ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    ["0", "-2147483648", "2147483647"],
]
BAD = [None, [], ["1e400", "abc"], ["yes"], ["fast"], ["2026-13-45"], ["noon"], ["00ff"], [], ["2147483648"]]


def _value(column: int, row: int, data: st.DataObject | None = None) -> str | None:
    if column == 0:
        return str(row * 7 + 1)  # the key: distinct, as a snapshot's keys are
    choices: list[str | None] = [None, *GOOD[column], *BAD[column]]
    if data is None:
        return choices[row % len(choices)]
    return data.draw(st.sampled_from(choices))


def _chunk(values: list[list[str | None]]) -> pa.Table:
    names = [c.name for c in SPEC.columns]
    columns = list(zip(*values, strict=True)) if values else [() for _ in names]
    return pa.table({name: pa.array(list(column), pa.string()) for name, column in zip(names, columns, strict=True)})


def _per_change(chunk: pa.Table, envelope: str, *, fail: bool = False, unknown: tuple[str, ...] = ()) -> dict:
    batches = ChangeBatches([SPEC], envelope, PARTITION, fail=fail, unknown=unknown)
    rows = [tuple(r.values()) for r in chunk.to_pylist()]
    changes = [(SPEC.output, Change("r", None, row)) for row in rows]
    return _tables([*batches.transaction(OFFSET, LSN, None, changes), *batches.finish()])


def _columnar(chunk: pa.Table, envelope: str, *, fail: bool = False, unknown: tuple[str, ...] = ()) -> dict:
    return _tables(list(chunk_batches(chunk, SPEC, envelope, PARTITION, OFFSET, LSN, fail=fail, unknown=unknown)))


def _captured(chunk: pa.Table) -> pa.Table:
    """The chunk as its capture task keeps it: :func:`typed_chunk`, through a parquet file."""
    sink = pa.BufferOutputStream()
    pq.write_table(typed_chunk(chunk, SPEC), sink)
    return pq.read_table(pa.BufferReader(sink.getvalue()))


def _tables(pairs: list[tuple[str, pa.RecordBatch]]) -> dict[str, pa.Table]:
    out: dict[str, list[pa.RecordBatch]] = {}
    for output, batch in pairs:
        out.setdefault(output, []).append(batch)
    return {output: pa.Table.from_batches(batches) for output, batches in out.items()}


def _assert_same(chunk: pa.Table, envelope: str, unknown: tuple[str, ...] = ()) -> dict[str, pa.Table]:
    want = _per_change(chunk, envelope, unknown=unknown)
    for got in (_columnar(chunk, envelope, unknown=unknown), _columnar(_captured(chunk), envelope, unknown=unknown)):
        assert got.keys() == want.keys() or (not chunk.num_rows and SPEC.output in got)
        for output, table in want.items():
            assert got[output].schema == table.schema, output
            assert _rows(got[output]) == _rows(table), output
    return got


def _rows(table: pa.Table) -> list[dict]:
    """Rows as Python values, NaN as a text (NaN is not equal to itself)."""
    return [_plain(row) for row in table.to_pylist()]


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return "NaN" if value != value else value


@pytest.mark.parametrize("envelope", ["upsert", "append"])
@pytest.mark.parametrize("unknown", [(), (SPEC.output,)])
def test_a_chunk_lands_as_the_per_change_path_lands_it(envelope, unknown):
    chunk = _chunk([[_value(j, i) for j in range(len(SPEC.columns))] for i in range(60)])
    got = _assert_same(chunk, envelope, unknown)
    assert 0 < got[ERRORS].num_rows < chunk.num_rows  # the bad values went to _errors, the rest landed


def test_a_chunk_every_value_of_which_types_is_kept_typed_else_as_its_texts():
    good = _chunk([[_value(j, i) if j in (0, 1) else GOOD[j][i % len(GOOD[j])] for j in range(10)] for i in range(9)])
    assert [f.type for f in typed_chunk(good, SPEC).schema] == [c.arrow for c in SPEC.columns]
    for envelope in ("upsert", "append"):
        assert ERRORS not in _assert_same(good, envelope)
    bad = _chunk([[_value(j, 4) for j in range(10)] for _ in range(1)])
    assert typed_chunk(bad, SPEC).equals(bad)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(0, 25), st.sampled_from(["upsert", "append"]))
def test_any_chunk_lands_as_the_per_change_path_lands_it(data, rows, envelope):
    chunk = _chunk([[_value(j, i, data) for j in range(len(SPEC.columns))] for i in range(rows)])
    _assert_same(chunk, envelope)


def test_an_empty_chunk_gives_an_empty_batch_of_the_outputs_schema():
    for envelope in ("upsert", "append"):
        got = _columnar(_chunk([]), envelope)
        want_schema = _per_change(_chunk([[_value(j, 0) for j in range(len(SPEC.columns))]]), envelope)[SPEC.output]
        assert got[SPEC.output].num_rows == 0
        assert got[SPEC.output].schema == want_schema.schema


@pytest.mark.parametrize("envelope", ["upsert", "append"])
def test_a_bad_value_under_fail_raises_as_the_per_change_path_does(envelope):
    row = [_value(j, 0) for j in range(len(SPEC.columns))]
    row[9] = "2147483648"
    chunk = _chunk([row])
    with pytest.raises(RecordError) as want:
        _per_change(chunk, envelope, fail=True)
    with pytest.raises(RecordError) as got:
        _columnar(chunk, envelope, fail=True)
    assert str(got.value) == str(want.value)

"""The MySQL source's pure parts: binlog positions as offsets, and a transaction's changes as upsert rows."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.errors import DefiniteSourceError
from reclock.sources.base import ERRORS
from reclock.sources.mysql.catalog import TableSpec, arrow_type
from reclock.sources.mysql.changes import DELETED, last_per_key, upsert_batch
from reclock.sources.mysql.position import offset_of, position_of, text

SPEC = TableSpec("db", "t", (("id", pa.int32()), ("v", pa.decimal128(6, 2))), ("id",))

positions = st.tuples(st.integers(1, 999_999), st.integers(4, 2**32 - 1))


@given(positions, positions)
def test_offsets_order_as_the_binlog_does_across_rotations(a, b):
    fa, fb = (f"binlog.{n:06d}" for n in (a[0], b[0]))
    assert (offset_of(fa, a[1]) < offset_of(fb, b[1])) == (a < b)
    assert position_of(offset_of(fa, a[1]), "binlog") == (fa, a[1])


def test_a_position_reads_as_file_and_byte():
    assert text(offset_of("binlog.000007", 1234), "binlog") == "binlog.000007:1234"
    with pytest.raises(DefiniteSourceError, match="has no number"):
        offset_of("binlog", 4)


def test_a_transaction_keeps_the_last_change_of_each_key_and_a_key_change_deletes_the_old():
    changes = [
        (None, {"id": 1, "v": 1}),
        ({"id": 1, "v": 1}, {"id": 1, "v": 2}),
        ({"id": 2, "v": 5}, {"id": 3, "v": 5}),
        ({"id": 4, "v": 0}, None),
    ]
    kept = last_per_key(SPEC, changes, 99)
    assert [(c.row["id"], c.deleted) for c in kept] == [(1, False), (2, True), (3, False), (4, True)]
    assert {c.offset for c in kept} == {99} and kept[0].row["v"] == 2


def test_a_value_its_column_cannot_hold_goes_to_errors_and_the_rest_lands():
    kept = last_per_key(SPEC, [(None, {"id": 1, "v": Decimal("1.5")}), (None, {"id": 2, "v": Decimal("1e9")})], 7)
    batches = dict(upsert_batch(SPEC, "binlog", kept, unknown=False, fail=False))
    assert batches["db_t"].to_pydict() == {
        "_partition": ["binlog"],
        "_offset": [7],
        "id": [1],
        "v": [Decimal("1.50")],
        DELETED: [False],
    }
    (message,) = batches[ERRORS].column("message").to_pylist()
    assert message.startswith("table db.t column v: value Decimal('1E+9') does not fit")


def test_an_added_column_is_an_unknown_field_and_a_dropped_one_is_definite():
    kept = last_per_key(SPEC, [(None, {"id": 1, "v": 1, "note": "x"})], 7)
    ((_, batch),) = upsert_batch(SPEC, "binlog", kept, unknown=True, fail=False)
    assert batch.column("_unknown_fields").to_pylist() == ['{"note": "x"}']
    with pytest.raises(DefiniteSourceError, match=r"table db\.t no longer has column v"):
        list(upsert_batch(SPEC, "binlog", last_per_key(SPEC, [(None, {"id": 1})], 7), unknown=False, fail=False))


def test_columns_land_as_arrow_types_that_hold_them():
    assert arrow_type("int", "int(10) unsigned", 10, 0) == pa.int64()
    assert arrow_type("bigint", "bigint(20) unsigned", 20, 0) == pa.uint64()
    assert arrow_type("decimal", "decimal(12,2)", 12, 2) == pa.decimal128(12, 2)
    assert arrow_type("datetime", "datetime(6)", None, None) == pa.timestamp("us")
    assert arrow_type("enum", "enum('a','b')", None, None) == pa.string()

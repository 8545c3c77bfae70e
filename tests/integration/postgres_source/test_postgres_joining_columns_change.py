"""A table whose columns change while it joins the publication behaves like any table of the
pipeline (issue 22, acceptance 3): columns added or dropped before its copy are simply its
output's columns; after the copy an added column follows ``schema_evolution`` and a dropped one is
the one-line definite error naming the table.

The database is changed between the ``ALTER PUBLICATION ... ADD TABLE`` and the probe that copies
the table, so the stream holds the table's changes under its older definitions below the copy's
consistent point. Checked with the tests' own Delta log reader (``tests.faults.reader``) against
what the database holds.
"""

from __future__ import annotations

import pytest

from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.reports import BatchFailed
from tests.integration.postgres_source.test_postgres_source import (
    drop_slot,
    execute,
    make_source,
    output_table,
    query,
)


def _mirror(lake, columns: list[str]) -> dict:
    rows = output_table(lake, "pg", "public_c").to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key landed twice"
    return {r["id"]: tuple(r.get(c) for c in columns) for r in rows}


def _table(postgres, db: str, columns: list[str]) -> dict:
    return {r[0]: tuple(r[1:]) for r in query(postgres, db, f"SELECT id, {', '.join(columns)} FROM c")}


def test_a_joining_tables_columns_changed_before_its_copy_are_its_outputs_and_after_follow_the_rules(
    postgres, tmp_path
):
    db = "join_columns"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE a (id int PRIMARY KEY, v int)", "INSERT INTO a VALUES (1, 1)")
    lake = tmp_path / "lake"
    source = make_source(postgres, db, tmp_path, tables=["a", "*"], read_timeout_s=5)
    pipeline = Pipeline("pg", lake, source, layouts={"public_c": OutputLayout(schema_evolution="add")})
    pipeline.step()
    execute(
        postgres,
        db,
        "CREATE TABLE c (id int PRIMARY KEY, v int, gone text, n int)",
        "INSERT INTO c SELECT g, g, 'x', g FROM generate_series(1, 20) g",
        f"ALTER PUBLICATION p_{db} ADD TABLE c",
        # Below the copy's consistent point: streamed under the definitions of their time.
        "UPDATE c SET v = -1 WHERE id = 1",
        "ALTER TABLE c ADD COLUMN note text",
        "UPDATE c SET note = 'two' WHERE id = 2",
        "ALTER TABLE c DROP COLUMN gone",
        "ALTER TABLE c ALTER COLUMN n TYPE bigint",
        "BEGIN; UPDATE c SET note = 'three' WHERE id = 3; UPDATE a SET v = 3 WHERE id = 1; COMMIT",
    )
    pipeline.step()  # the probe copies c as it is now: id, v, n (bigint), note
    assert output_table(lake, "pg", "public_c").schema.field("n").type.bit_width == 64
    assert "gone" not in output_table(lake, "pg", "public_c").column_names
    assert _mirror(lake, ["v", "n", "note"]) == _table(postgres, db, ["v", "n", "note"])
    # After the copy: an added nullable column follows schema_evolution, as for any table.
    execute(postgres, db, "ALTER TABLE c ADD COLUMN extra text", "UPDATE c SET extra = 'e', v = 40 WHERE id = 4")
    pipeline.step()
    assert _mirror(lake, ["v", "note", "extra"]) == _table(postgres, db, ["v", "note", "extra"])
    # A dropped column: the one-line definite error naming the table, nothing of the batch lands.
    execute(postgres, db, "ALTER TABLE c DROP COLUMN note", "INSERT INTO c (id, v, n) VALUES (100, 100, 100)")
    with pytest.raises(BatchFailed, match=r"DefiniteSourceError: table public\.c: column note was dropped") as failed:
        pipeline.step()
    assert "\n" not in str(failed.value)
    assert 100 not in _mirror(lake, ["v"])
    drop_slot(postgres, db, source.options.slot)

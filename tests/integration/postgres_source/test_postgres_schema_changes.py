"""The Postgres source when the database changes shape under it: TRUNCATE, columns added,
dropped or retyped (issue 22, acceptance 3).

Each test makes its own database on the session's server, runs a pipeline in the driver and
checks the Delta tables with the tests' own log reader (``tests.faults.reader``, no product code)
against what the database holds.
"""

from __future__ import annotations

import json

import pytest

from reclock.persist.evolution import SchemaEvolutionError
from reclock.persist.lake import Lake, sink_id
from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.reports import BatchFailed
from tests.faults.reader import DeltaLog, label_of
from tests.integration.postgres_source.test_postgres_source import (
    drop_slot,
    execute,
    make_source,
    output_table,
    query,
)


def _mirror(lake, output: str) -> dict:
    return {r["id"]: r["v"] for r in output_table(lake, "pg", output).to_pylist()}


def _last_commit(lake, output: str) -> list[dict]:
    path = Lake.at(lake).output_path("pg", output) / "_delta_log"
    newest = max(path.glob("*.json"))
    return [json.loads(line) for line in newest.read_text().splitlines() if line.strip()]


def test_a_truncate_empties_an_upsert_output_in_its_transactions_commit(postgres, tmp_path):
    db = "truncate"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "CREATE TABLE b (id int PRIMARY KEY, v int)",
        "INSERT INTO a SELECT g, g FROM generate_series(1, 100) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 5) g",
    )
    lake = tmp_path / "lake"
    source = make_source(postgres, db, tmp_path, tables=["a", "b"])
    pipeline = Pipeline("pg", lake, source)
    pipeline.step()
    assert len(_mirror(lake, "public_a")) == 100
    # One transaction: changes of a before its TRUNCATE (gone with it), after it (kept), and of b.
    execute(
        postgres,
        db,
        "BEGIN; INSERT INTO a VALUES (101, 1); UPDATE a SET v = 0 WHERE id = 7; UPDATE b SET v = -1 WHERE id = 1; "
        "TRUNCATE a; INSERT INTO a VALUES (7, 70), (8, 80); UPDATE a SET v = 81 WHERE id = 8; "
        "INSERT INTO b VALUES (6, 6); COMMIT",
    )
    versions = {o: DeltaLog(Lake.at(lake).output_path("pg", o)).refresh().version for o in ("public_a", "public_b")}
    pipeline.step()
    assert _mirror(lake, "public_a") == dict(query(postgres, db, "SELECT id, v FROM a")) == {7: 70, 8: 81}
    assert _mirror(lake, "public_b") == dict(query(postgres, db, "SELECT id, v FROM b"))
    # The rows the TRUNCATE removed went in the batch's one commit of a, at b's label: a cut at
    # that time never sees b's half of the transaction without a's.
    for output in ("public_a", "public_b"):
        log = DeltaLog(Lake.at(lake).output_path("pg", output)).refresh()
        assert log.version == versions[output] + 1, output
    commit = _last_commit(lake, "public_a")
    assert any("remove" in action for action in commit) and any("add" in action for action in commit)
    labels = {
        o: label_of(DeltaLog(Lake.at(lake).output_path("pg", o)).refresh(), sink_id("pg", o))
        for o in ("public_a", "public_b")
    }
    assert labels["public_a"] == labels["public_b"]
    # A TRUNCATE of both tables, then a transaction after it in the same batch.
    execute(postgres, db, "TRUNCATE a, b", "INSERT INTO a VALUES (1, 1)", "INSERT INTO b VALUES (2, 2)")
    pipeline.step()
    assert _mirror(lake, "public_a") == dict(query(postgres, db, "SELECT id, v FROM a")) == {1: 1}
    assert _mirror(lake, "public_b") == dict(query(postgres, db, "SELECT id, v FROM b")) == {2: 2}
    # A TRUNCATE with nothing after it leaves the output empty.
    execute(postgres, db, "TRUNCATE b")
    pipeline.step()
    assert _mirror(lake, "public_b") == {}
    assert _mirror(lake, "public_a") == {1: 1}
    drop_slot(postgres, db, source.options.slot)


def test_a_truncate_of_a_published_table_the_pipeline_does_not_read_is_ignored(postgres, tmp_path):
    db = "truncother"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "CREATE PUBLICATION p_truncother FOR TABLE a, other",
    )
    lake = tmp_path / "lake"
    source = make_source(postgres, db, tmp_path, tables=["a"])
    pipeline = Pipeline("pg", lake, source)
    pipeline.step()
    execute(postgres, db, "INSERT INTO a VALUES (1, 1)", "TRUNCATE other", "INSERT INTO a VALUES (2, 2)")
    pipeline.step()
    assert _mirror(lake, "public_a") == {1: 1, 2: 2}
    drop_slot(postgres, db, source.options.slot)


@pytest.mark.parametrize("mode", ["add", "rescue", "fail", "none"])
def test_a_column_added_while_running_follows_schema_evolution(postgres, tmp_path, mode):
    """The column's first change brings a Relation message with it: under ``add`` the output gains
    it (text form, null for rows the stream has not changed since), under ``rescue`` it goes to
    ``_rescued``, under ``fail`` nothing of the batch lands. A restart keeps the outputs the
    pipeline made (its WAL from before the ALTER replays as it was) and goes on."""
    db = f"added_{mode}"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)")
    lake = tmp_path / "lake"
    layouts = {"public_t": OutputLayout(schema_evolution=mode)}
    source = make_source(postgres, db, tmp_path, tables=["t"])
    pipeline = Pipeline("pg", lake, source, layouts=layouts)
    pipeline.step()
    execute(
        postgres,
        db,
        "INSERT INTO t VALUES (10, 10)",
        "BEGIN; ALTER TABLE t ADD COLUMN note text; INSERT INTO t VALUES (4, 4, 'four'); COMMIT",
        "UPDATE t SET note = 'one' WHERE id = 1",
        "INSERT INTO t VALUES (5, 5, NULL)",
        "DELETE FROM t WHERE id = 3",
    )
    database = {r[0]: (r[1], r[2]) for r in query(postgres, db, "SELECT id, v, note FROM t")}
    if mode == "fail":
        with pytest.raises(SchemaEvolutionError, match=r"output 'public_t': new field 'note'") as failed:
            pipeline.step()
        assert "\n" not in str(failed.value)
        rows = output_table(lake, "pg", "public_t")
        assert sorted(rows.column("id").to_pylist()) == [1, 2, 3] and "note" not in rows.column_names
        drop_slot(postgres, db, source.options.slot)
        return
    pipeline.step()
    rows = output_table(lake, "pg", "public_t").to_pylist()
    if mode == "none":
        assert {r["id"]: r["v"] for r in rows} == {i: v for i, (v, _) in database.items()}
        assert "note" not in rows[0]
        drop_slot(postgres, db, source.options.slot)
        return
    if mode == "add":
        assert {r["id"]: (r["v"], r["note"]) for r in rows} == database
    else:
        got = {r["id"]: (r["v"], r["_rescued"]) for r in rows}
        assert got == {
            i: (v, None if i in (2, 10) else json.dumps({"note": note}, separators=(",", ":")))
            for i, (v, note) in database.items()
        }
    # A restart: the outputs stay those the pipeline made, and the replay and the stream go on.
    again = make_source(postgres, db, tmp_path, tables=["t"])
    assert [f.name for f in again.outputs()[0].schema] == ["id", "v"]
    execute(postgres, db, "UPDATE t SET note = 'two' WHERE id = 2", "INSERT INTO t VALUES (6, 6, 'six')")
    Pipeline("pg", lake, again, layouts=layouts).step()
    rows = output_table(lake, "pg", "public_t").to_pylist()
    database = {r[0]: (r[1], r[2]) for r in query(postgres, db, "SELECT id, v, note FROM t")}
    if mode == "add":
        assert {r["id"]: (r["v"], r["note"]) for r in rows} == database
    else:
        assert {r["id"]: r["v"] for r in rows} == {i: v for i, (v, _) in database.items()}
        assert {r["id"]: r["_rescued"] for r in rows}[6] == '{"note":"six"}'
    drop_slot(postgres, db, source.options.slot)


@pytest.mark.parametrize(
    ("alter", "message"),
    [
        (
            "ALTER TABLE t DROP COLUMN a",
            r"table public\.t: column a was dropped or renamed, and output public_t holds it",
        ),
        ("ALTER TABLE t RENAME COLUMN a TO z", r"table public\.t: column a was dropped or renamed"),
        ("ALTER TABLE t ALTER COLUMN b TYPE text", r"table public\.t: column b is now of type OID 25 \(string\)"),
        ("ALTER TABLE t ALTER COLUMN b TYPE bigint", r"table public\.t: column b is now of type OID 20 \(int64\)"),
    ],
)
def test_a_dropped_or_retyped_column_is_a_definite_error_naming_it(postgres, tmp_path, alter, message):
    """One line naming the table and the column; nothing of the batch lands, and the pipeline
    fails as for any definite error. A change of type the output still holds is no error."""
    db = "dropped_" + str(abs(hash(alter)) % 10**6)
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE t (id int PRIMARY KEY, a text, b int, c varchar(5))",
        "INSERT INTO t VALUES (1, 'x', 1, 'c')",
    )
    lake = tmp_path / "lake"
    source = make_source(postgres, db, tmp_path, tables=["t"], read_timeout_s=5)
    pipeline = Pipeline("pg", lake, source)
    pipeline.step()
    execute(postgres, db, "ALTER TABLE t ALTER COLUMN c TYPE varchar(50)", "INSERT INTO t (id, c) VALUES (2, 'cc')")
    pipeline.step()
    assert sorted(output_table(lake, "pg", "public_t").column("id").to_pylist()) == [1, 2]
    execute(postgres, db, "INSERT INTO t (id) VALUES (3)", alter, "INSERT INTO t (id) VALUES (4)")
    with pytest.raises(BatchFailed, match="DefiniteSourceError: " + message) as failed:
        pipeline.step()
    assert "\n" not in str(failed.value)
    assert sorted(output_table(lake, "pg", "public_t").column("id").to_pylist()) == [1, 2]
    drop_slot(postgres, db, source.options.slot)


def test_an_append_output_gets_an_added_column_beside_before_and_after(postgres, tmp_path):
    db = "added_append"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY, v int)", "INSERT INTO t VALUES (1, 1)")
    lake = tmp_path / "lake"
    source = make_source(postgres, db, tmp_path, tables=["t"], envelope="append")
    pipeline = Pipeline("pg", lake, source, layouts={"public_t": OutputLayout(schema_evolution="add")})
    pipeline.step()
    execute(
        postgres,
        db,
        "ALTER TABLE t ADD COLUMN note text",
        "INSERT INTO t VALUES (2, 2, 'two')",
        "UPDATE t SET note = 'one' WHERE id = 1",
        "DELETE FROM t WHERE id = 2",
    )
    pipeline.step()
    rows = output_table(lake, "pg", "public_t").sort_by([("_offset", "ascending"), ("seq", "ascending")])
    got = [(r["op"], (r["after"] or r["before"])["id"], r["note"]) for r in rows.to_pylist()]
    # The delete's old row is its key only (replica identity default): its note is null.
    assert got == [("r", 1, None), ("c", 2, "two"), ("u", 1, "one"), ("d", 2, None)]
    drop_slot(postgres, db, source.options.slot)

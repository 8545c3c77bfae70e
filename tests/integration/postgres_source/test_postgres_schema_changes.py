"""The Postgres source when the database changes shape under it: TRUNCATE, columns added,
dropped or retyped (issue 22, acceptance 3).

Each test makes its own database on the session's server, runs a pipeline in the driver and
checks the Delta tables with the tests' own log reader (``tests.faults.reader``, no product code)
against what the database holds.
"""

from __future__ import annotations

import json

from reclock.persist.lake import Lake, sink_id
from reclock.runtime.pipeline import Pipeline
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

"""A table removed from the publication while the pipeline runs: its output stays readable and
stops at the removal, the other tables go on, the removal is said once (the log) and shown by
``reclock status`` (the source's warnings), the resume frontier is not held back by the stopped
output, and the table coming back joins again.

Against the session's server; outputs read from their ``_delta_log`` with the tests' own reader
(``tests.faults.reader``), the slot's confirmed position from ``pg_replication_slots``.
"""

from __future__ import annotations

import logging

from reclock.runtime.pipeline import Pipeline
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source, query
from tests.integration.postgres_source.test_postgres_tables_join import _labelled_versions, _rows, _table


def test_a_table_that_leaves_the_publication_stops_its_output_and_the_others_go_on(postgres, tmp_path, caplog):
    db = "leaves"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "CREATE TABLE b (id int PRIMARY KEY, v int)",
        "INSERT INTO a SELECT g, g FROM generate_series(1, 10) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 10) g",
        f"CREATE PUBLICATION p_{db} FOR TABLE a, b",  # b: an initial table taken by "*" alone
    )
    lake = tmp_path / "lake"

    def source():
        return make_source(postgres, db, tmp_path, tables=["a", "*"])

    pipeline = Pipeline("pg", lake, source())
    pipeline.step()
    execute(
        postgres,
        db,
        "CREATE TABLE c (id int PRIMARY KEY, v int)",
        "INSERT INTO c SELECT g, g FROM generate_series(1, 10) g",
        f"ALTER PUBLICATION p_{db} ADD TABLE c",
    )
    pipeline.step()  # c joins
    execute(
        postgres, db, "BEGIN; UPDATE a SET v = 0 WHERE id = 1; UPDATE b SET v = 0; DELETE FROM c WHERE id < 5; COMMIT"
    )
    pipeline.step()
    # b (an initial table) and c (a joined one) leave; what was written before lands, not after.
    execute(
        postgres,
        db,
        "BEGIN; UPDATE b SET v = 1 WHERE id = 1; UPDATE c SET v = 1 WHERE id = 5; COMMIT",
        f"ALTER PUBLICATION p_{db} DROP TABLE b, c",
    )
    at_removal = {"b": _table(postgres, db, "b"), "c": _table(postgres, db, "c")}
    ((removed,),) = query(postgres, db, "SELECT pg_current_wal_insert_lsn()")
    execute(postgres, db, "BEGIN; UPDATE a SET v = -1; DELETE FROM b; INSERT INTO c VALUES (100, 100); COMMIT")
    with caplog.at_level(logging.WARNING, logger="reclock.sources.postgres"):
        for _ in range(3):
            execute(postgres, db, "UPDATE a SET v = v - 1 WHERE id = 2")
            pipeline.step()
    assert _rows(lake, "public_a") == _table(postgres, db, "a")
    assert _rows(lake, "public_b") == at_removal["b"]
    assert _rows(lake, "public_c") == at_removal["c"]
    said = [r.getMessage() for r in caplog.records if "left publication" in r.getMessage()]
    assert len(said) == 2 and any("public.b" in m for m in said) and any("public.c" in m for m in said)
    warnings = pipeline.source.warnings()
    assert [w.split(":")[0] for w in warnings] == [
        f"table public.b left publication p_{db}",
        f"table public.c left publication p_{db}",
    ]
    # Stopped, not held back: every output carries the last batch's label, and the slot is
    # confirmed past the removal.
    last = {o: _labelled_versions(lake, o)[-1][1] for o in ("public_a", "public_b", "public_c")}
    assert last["public_a"] == last["public_b"] == last["public_c"] == pipeline.resume_upper - 1
    (confirmed,) = query(
        postgres,
        db,
        f"SELECT confirmed_flush_lsn > '{removed}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 's_{db}'",
    )
    assert confirmed == (True,)
    # A restart keeps them stopped, says so without logging it again, and goes on.
    restarted = Pipeline("pg", lake, source())
    assert len(restarted.source.warnings()) == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="reclock.sources.postgres"):
        execute(postgres, db, "UPDATE a SET v = 7 WHERE id = 3", "UPDATE b SET v = 7 WHERE id = 3")
        restarted.step()
    assert not [r for r in caplog.records if "left publication" in r.getMessage()]
    assert _rows(lake, "public_a") == _table(postgres, db, "a")
    assert _rows(lake, "public_b") == at_removal["b"]
    # Coming back: b joins again with a fresh copy (test_postgres_tables_rejoin.py pins the rest).
    execute(postgres, db, f"ALTER PUBLICATION p_{db} ADD TABLE b", "INSERT INTO b VALUES (50, 50)")
    restarted.step()
    assert _rows(lake, "public_b") == _table(postgres, db, "b")
    assert [w.split(":")[0] for w in restarted.source.warnings()] == [f"table public.c left publication p_{db}"]
    drop_slot(postgres, db, f"s_{db}")

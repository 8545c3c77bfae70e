"""The Postgres source on the Spark data plane: the snapshot's capture is one Spark job, its
chunks landed ahead of their binding by the batch's tasks (each joining the exported snapshot),
and its batch runs no second one; the replication range runs as a Spark task (the source and its
splits cross to the Python workers pickled), and the tables land as on the driver."""

from __future__ import annotations

from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import SparkDataPlane
from reclock.sources.postgres.source import ChunkSplit
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source, output_table, query


def test_snapshot_chunks_and_changes_run_as_spark_tasks(postgres, spark, tmp_path):
    db = "onspark"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2))",
        "INSERT INTO items SELECT g, 'item ' || g, g / 10.0 FROM generate_series(1, 20000) g",
    )
    source = make_source(postgres, db, tmp_path, tables=["items"], snapshot_chunk_pages=20)
    pipeline = Pipeline("pg", tmp_path / "lake", source, data_plane=SparkDataPlane(spark))
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    first = pipeline.step()
    chunks = [r for r in first.results if isinstance(r.split, ChunkSplit)]
    assert len(chunks) == len(source._captured().chunks) > 4  # every chunk a split of its own
    # The capture and its landing were one Spark job, the chunks (alike) packed into one task per
    # core; the batch committed what it wrote, with no job of its own.
    captures = [tracker.getJobInfo(j) for j in set(tracker.getJobIdsForGroup()) - before]
    assert len(captures) == 1 and captures[0].status == "SUCCEEDED"
    stages = [tracker.getStageInfo(s) for s in captures[0].stageIds]
    assert sum(stage.numTasks for stage in stages) == spark.sparkContext.defaultParallelism < len(chunks)
    assert all(r.error is None for r in first.results)
    assert first.rows["public_items"] == 20000
    execute(
        postgres,
        db,
        "BEGIN; UPDATE items SET price = price * 2 WHERE id % 7 = 0; DELETE FROM items WHERE id > 19990; COMMIT",
    )
    pipeline.step()
    got = {r["id"]: (r["name"], r["price"]) for r in output_table(tmp_path / "lake", "pg", "public_items").to_pylist()}
    assert got == {i: (n, p) for i, n, p in query(postgres, db, "SELECT id, name, price FROM items")}
    drop_slot(postgres, db, source.options.slot)

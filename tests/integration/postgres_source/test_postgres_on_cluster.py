"""A Postgres pipeline on the Spark standalone cluster, exactly once (see
``tests/integration/test_standalone_cluster.py`` for the cluster, ``kafka/test_kafka_on_cluster.py``
for the same with Kafka).

The executors import only what the driver shipped, and run the snapshot's capture (one task per
chunk, each joining the snapshot the driver exported), the chunks' landing and the replication
range. The job is stopped with ``reclock stop`` once its status says the stream caught up; the
output is then read from outside (``tests.faults.reader``) against the database's own rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from tests.faults.reader import DeltaLog, read_rows
from tests.integration.cluster import applications, cluster_env, finish, start_on_cluster, tasks_per_worker

ROWS = 40_000


def test_postgres_runs_on_the_cluster_exactly_once(postgres, spark_cluster, executor_python, tmp_path):
    driver_python = Path(sys.executable)  # this checkout's reclock; the executors get it shipped
    earlier = applications(spark_cluster)
    db = "oncluster"
    dsn = postgres.create_database(db)
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2))")
        cur.execute(f"INSERT INTO items SELECT g, 'item ' || g, g / 10.0 FROM generate_series(1, {ROWS}) g")
    source = {"kind": "postgres", "dsn": dsn, "tables": ["items"], "snapshot_chunk_pages": 40}
    job = start_on_cluster(tmp_path, "shop", source, spark_cluster, executor_python, driver_python)
    lake = tmp_path / "lake"
    status_path = lake / "shop" / "status.json"

    def status() -> dict:
        try:
            return json.loads(status_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    deadline = time.monotonic() + 600
    while not status().get("rows", {}).get("public_items") and job.poll() is None:
        assert time.monotonic() < deadline, "the snapshot did not land"
        time.sleep(0.5)
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("BEGIN; UPDATE items SET price = price * 2 WHERE id % 7 = 0; DELETE FROM items WHERE id > 39990")
        cur.execute("INSERT INTO items VALUES (50000, 'late', 1); COMMIT")
        cur.execute("SELECT pg_current_wal_flush_lsn() - '0/0'")
        flushed = int(cur.fetchone()[0])
    while json.loads(status().get("resume_frontier", "{}")).get("offsets", {}).get("wal", 0) < flushed:
        assert job.poll() is None, (tmp_path / "shop.stderr").read_text()[-3000:]
        assert time.monotonic() < deadline, "the stream did not catch up"
        time.sleep(0.5)
    stop = subprocess.run(
        ["reclock", "stop", "shop", "--wait", "120"],
        cwd=tmp_path,
        env=cluster_env(executor_python, driver_python),
        capture_output=True,
        text=True,
    )
    assert stop.returncode == 0, stop.stderr
    finish(job, tmp_path, "shop")

    got = read_rows(DeltaLog(lake / "shop" / "outputs" / "public_items").refresh()).to_pylist()
    assert len(got) == len({r["id"] for r in got}), "duplicated rows"
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, price FROM items")
        want = {i: (n, p) for i, n, p in cur.fetchall()}
    assert {r["id"]: (r["name"], r["price"]) for r in got} == want
    manifest = json.loads((lake / "shop" / "control" / "source" / "snapshot.json").read_text())
    assert len(manifest["chunks"]) > 4  # the capture was cut into tasks
    ran = tasks_per_worker(spark_cluster, skip=earlier)
    assert all(n > 0 for n in ran), f"tasks per worker's executors: {ran}"
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot('reclock_shop')")

"""A table snapshotted and streamed exactly once, with the job SIGKILLed inside the snapshot's capture.

``big`` holds 1,000,000 rows (issue 22's acceptance 2; the whole test takes about 15 s here, so
it is not behind ``--long``). ``reclock start`` captures it in chunks of a few pages, on the
driver plane's threads, landed ahead of its binding as the output's own files (uncommitted); the
test sees the slot's exporting connection in the server (``pg_stat_activity``), takes an
exclusive lock on the table unless the tasks copy it already (the capture then waits for it),
and SIGKILLs the job, so the kill lands inside the capture, never by timing. The restarted
job captures again at a new slot and streams inserts, updates, deletes and key changes made
after it. At the end the output, read from outside (the Delta log replayed by
``tests.faults.reader``, a lake in S3 copied out with boto3 first), equals the database's own
rows: no duplicate, no gap; the rows the stream never touched share one into time (the snapshot,
bound whole). The same runs on a lake in object storage (moto's server), the capture's files and
manifest in the bucket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing, suppress
from pathlib import Path

import psycopg2
import pytest

from tests import zygote
from tests.faults.reader import DeltaLog, read_rows
from tests.integration.helpers import reclock_cli, write_config
from tests.integration.s3 import mirror
from tests.waiting import PATIENCE_S

CHANGED = 1_000  # ids 1..CHANGED are updated, deleted or re-keyed by the stream


def _fill(postgres, db: str, rows: int) -> str:
    dsn = postgres.create_database(db)
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE big (id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2))")
        cur.execute(
            f"INSERT INTO big SELECT g, 'row ' || g, CASE WHEN g % 5 = 0 THEN NULL ELSE g / 100.0 END "
            f"FROM generate_series(1, {rows}) g"
        )
        cur.execute("VACUUM ANALYZE big")
    return dsn


def _change(postgres, db: str, rows: int) -> None:
    """Stream work on the snapshot's rows, in a few transactions: every kind of change."""
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE big SET name = name || ' updated', amount = 7 WHERE id <= {CHANGED} AND id % 3 = 0")
        cur.execute(f"DELETE FROM big WHERE id <= {CHANGED} AND id % 3 = 1")
        cur.execute(f"UPDATE big SET id = id + {rows} WHERE id <= {CHANGED} AND id % 3 = 2")
        cur.execute(f"INSERT INTO big SELECT g, 'new ' || g, NULL FROM generate_series({3 * rows}, {3 * rows + 999}) g")


def _database(postgres, db: str) -> dict[int, tuple]:
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name, amount FROM big")
        return {i: (n, a) for i, n, a in cur.fetchall()}


def _start(lake: str, name: str, env: dict[str, str], stderr: Path) -> subprocess.Popen:
    with open(stderr, "ab") as err:
        return zygote.popen(
            ["--lake", lake, "start", name],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _exporting(postgres, db: str) -> bool:
    """Whether a capture is under way: its slot's exporting replication connection is open (the
    server's own ``pg_stat_activity``; nothing else of the job replicates before a manifest)."""
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'walsender' "
            "AND datname = current_database())"
        )
        return cur.fetchone()[0]


def _kill_inside_the_capture(
    postgres, db: str, job: subprocess.Popen, manifest: Callable[[], bool], stderr: Path
) -> None:
    """SIGKILL ``job`` inside its capture, by construction: once its slot's snapshot is exported,
    the test takes an exclusive lock on ``big`` (unless the tasks copy it already), so the capture
    waits for it, and kills; the manifest must not exist after."""
    deadline = time.monotonic() + 240
    while not _exporting(postgres, db):
        assert job.poll() is None, stderr.read_text()[-3000:]
        assert not manifest(), "the capture ended before the test saw it"
        assert time.monotonic() < deadline, "the capture never started"
        time.sleep(0.02)
    with closing(postgres.connect(db)) as held:
        held.autocommit = False  # the lock lasts until the connection closes, after the kill
        with suppress(psycopg2.errors.LockNotAvailable), held.cursor() as cur:
            cur.execute("LOCK TABLE big IN ACCESS EXCLUSIVE MODE NOWAIT")
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=PATIENCE_S)
    assert not manifest(), "the kill landed after the capture: the test must kill inside it"


def _run(
    postgres,
    tmp_path: Path,
    db: str,
    rows: int,
    lake: str,
    env: dict[str, str],
    manifest: Callable[[], bool],
    status: Callable[[], dict],
) -> float:
    """Create, start, kill inside the capture, restart, stream, stop; the seconds it took. The
    pipeline is named after ``db`` (slots are the server's, not a database's: one name each)."""
    dsn = _fill(postgres, db, rows)
    config = write_config(
        tmp_path / f"{db}.toml",
        pipeline={"name": db, "lake": lake, "engine": "local", "batch_interval": 0.2, "idle_interval": 1.0},
        source={"kind": "postgres", "dsn": dsn, "tables": ["big"], "snapshot_chunk_pages": 16},
    )
    created = reclock_cli("create", str(config), cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr
    stderr = tmp_path / "job.stderr"
    started = time.monotonic()
    job = _start(lake, db, env, stderr)
    try:
        _kill_inside_the_capture(postgres, db, job, manifest, stderr)
        job = _start(lake, db, env, stderr)
        deadline = time.monotonic() + 600
        while not status().get("rows", {}).get("public_big"):
            assert job.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "the snapshot did not land"
            time.sleep(0.2)
        _change(postgres, db, rows)
        with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_flush_lsn() - '0/0'")
            flushed = int(cur.fetchone()[0])
        while json.loads(status().get("resume_frontier", "{}")).get("offsets", {}).get("wal", 0) < flushed:
            assert job.poll() is None, stderr.read_text()[-3000:]
            assert time.monotonic() < deadline, "the stream did not catch up"
            time.sleep(0.2)
        assert reclock_cli("--lake", lake, "stop", db, "--wait", "60", env=env).returncode == 0
        assert job.wait(timeout=60) == 0, stderr.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    took = time.monotonic() - started
    with closing(postgres.connect(db)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT pg_drop_replication_slot('reclock_{db}')")
    return took


def _check(postgres, db: str, output: Path, rows: int) -> None:
    """The output is the table: every id once, with the database's values; the snapshot's rows
    the stream left alone all at one into time."""
    got = read_rows(DeltaLog(output).refresh()).to_pylist()
    ids = [r["id"] for r in got]
    assert len(ids) == len(set(ids)), "duplicated rows"
    want = _database(postgres, db)
    deleted = len([i for i in range(1, CHANGED + 1) if i % 3 == 1])
    assert len(want) == rows - deleted + 1_000  # the workload did what it says
    mine = {r["id"]: (r["name"], r["amount"]) for r in got}
    assert mine.keys() == want.keys(), (sorted(mine.keys() - want.keys())[:5], sorted(want.keys() - mine.keys())[:5])
    assert mine == want
    untouched = {r["_into_ts"] for r in got if CHANGED < r["id"] <= rows}
    assert len(untouched) == 1, f"the snapshot landed at {len(untouched)} into times"


@pytest.mark.usefixtures("reclock_processes")
def test_a_snapshot_killed_in_its_capture_lands_the_table_exactly_once(postgres, tmp_path):
    rows = 1_000_000
    lake = tmp_path / "lake"
    source = lake / "bigsnap" / "control" / "source"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def status() -> dict:
        try:
            return json.loads((lake / "bigsnap" / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    took = _run(
        postgres,
        tmp_path,
        "bigsnap",
        rows,
        str(lake),
        env,
        lambda: (source / "snapshot.json").exists(),
        status,
    )
    _check(postgres, "bigsnap", lake / "bigsnap" / "outputs" / "public_big", rows)
    print(f"rows={rows} seconds={took:.1f}")


@pytest.mark.usefixtures("reclock_processes")
def test_a_snapshot_into_a_lake_in_object_storage_survives_a_kill_in_its_capture(postgres, s3_server, tmp_path):
    rows = 60_000
    bucket = s3_server.bucket()
    client = s3_server.client()
    prefix = "lake/s3snap/control/source"
    env = {**os.environ, **s3_server.environ, "PYSPARK_PYTHON": sys.executable}

    def keys(under: str) -> list[str]:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=under)
        return [item["Key"] for item in listed.get("Contents", [])]

    def status() -> dict:
        try:
            return json.loads(client.get_object(Bucket=bucket, Key="lake/s3snap/status.json")["Body"].read())
        except client.exceptions.NoSuchKey:
            return {}

    _run(
        postgres,
        tmp_path,
        "s3snap",
        rows,
        f"s3://{bucket}/lake",
        env,
        lambda: f"{prefix}/snapshot.json" in keys(f"{prefix}/"),
        status,
    )
    copy = mirror(s3_server, bucket, "lake/s3snap", tmp_path / "mirror")
    assert (copy / "control" / "source" / "snapshot.json").exists()  # the capture's state is in the bucket
    _check(postgres, "s3snap", copy / "outputs" / "public_big", rows)

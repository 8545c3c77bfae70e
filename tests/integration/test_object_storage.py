"""Lakes in an object store: a real S3-compatible server (moto's, its own process), checked from outside.

What lands on the server is read back by mirroring the bucket with boto3 and replaying the Delta
logs with the independent reader of ``tests.faults.reader``, never with the code under test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from reclock.errors import FencedError
from reclock.job.lifecycle import file_states
from reclock.job.status import read_status
from reclock.persist.asof import CLOSED_UPPER, read_as_of, readable_upper
from reclock.persist.data_files import write_data_file
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import RemapTable
from reclock.persist.sink import OutputSink, table_schema
from reclock.timeline.frontier import Frontier, encode_partition
from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.proxy import FaultProxy
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import (
    expected_generator_offsets,
    files_pipeline_config,
    reclock_cli,
    write_config,
    write_numbered_csvs,
)
from tests.integration.s3 import S3Server, mirror
from tests.waiting import PATIENCE_S, run_until


def _delta_options(server: S3Server) -> dict[str, str]:
    return {
        "aws_endpoint_url": server.endpoint,
        "aws_region": "us-east-1",
        "aws_access_key_id": server.access_key_id,
        "aws_secret_access_key": server.secret_access_key,
        "aws_allow_http": "true",
        "conditional_put": "etag",
    }


def test_a_writer_holding_a_stale_snapshot_fails_with_commit_failed_on_the_server(s3_server):
    """What the remap table and the sinks build on: delta-rs's put-if-absent of a log entry is the
    store's conditional write, so a second commit of the same version is refused, not overwritten."""
    uri = f"s3://{s3_server.bucket()}/t"
    options = _delta_options(s3_server)
    DeltaTable.create(uri, schema=pa.schema([("x", pa.int64())]), storage_options=options)
    first, second = DeltaTable(uri, storage_options=options), DeltaTable(uri, storage_options=options)
    once = CommitProperties(max_commit_retries=0)
    write_deltalake(first, pa.table({"x": [1]}), mode="append", commit_properties=once)
    with pytest.raises(CommitFailedError):
        write_deltalake(second, pa.table({"x": [2]}), mode="append", commit_properties=once)
    assert DeltaTable(uri, storage_options=options).version() == 1


def test_two_writers_racing_on_the_remap_table_one_loses_and_adopts_what_won(s3_server, tmp_path):
    bucket = s3_server.bucket()
    lake = Lake.at(f"s3://{bucket}/lake", s3_server.storage_options)
    path = lake.remap_path("race")
    a, b = RemapTable(path, lake.store), RemapTable(path, lake.store)
    for i in range(1, 9):
        # Both hold the same snapshot and propose a binding for the same time; they take turns winning.
        first, second = (a, b) if i % 2 else (b, a)
        assert first.mint(1000 * i, Frontier({0: 10 * i, 1: 7 * i}))
        assert not second.mint(1000 * i, Frontier({0: 10 * i + 3, 1: 7 * i + 2})), "a stale writer rebound a range"
        assert list(second.bindings) == list(first.bindings), "the loser did not adopt what won"
    # A loser whose proposal still advances time and frontier mints only the remainder.
    assert a.mint(9000, Frontier({0: 90, 1: 63}))
    assert b.mint(9001, Frontier({0: 95, 1: 63}))
    assert list(a.sync()) == list(b.bindings)
    assert list(b.bindings)[-2:] == [(9000, Frontier({0: 90, 1: 63})), (9001, Frontier({0: 95, 1: 63}))]

    # From outside: one commit per binding, and no offset range of a partition bound twice.
    remap_log = DeltaLog(mirror(s3_server, bucket, "lake/race/remap", tmp_path / "remap")).refresh()
    assert remap_log.version == 10  # creation, then exactly one commit per binding
    rows = read_rows(remap_log).to_pylist()
    bound = {
        p: sorted((r["into_ts"], r["offset"]) for r in rows if r["partition"] == encode_partition(p)) for p in (0, 1)
    }
    assert bound[0] == [(1000 * i, 10 * i) for i in range(1, 10)] + [(9001, 95)]
    assert bound[1] == [(1000 * i, 7 * i) for i in range(1, 10)]
    assert Remap(rows).frontier_at(9001) == {encode_partition(0): 95, encode_partition(1): 63}


def test_sink_labels_on_the_server_skip_a_replay_and_fence_a_stale_driver(s3_server, tmp_path):
    bucket = s3_server.bucket()
    lake = Lake.at(f"s3://{bucket}/lake", s3_server.storage_options)
    path, app_id = lake.output_path("p", "t"), sink_id("p", "t")
    schema = table_schema(pa.schema([("x", pa.int64())]))

    def batch(sink: OutputSink, xs: list[int], into_ts: int):
        rows = pa.table({"x": xs, "_into_ts": [into_ts] * len(xs), "_partition": ["0"] * len(xs), "_offset": xs})
        return [write_data_file(str(sink.write_root), "t", rows.cast(schema), lake.store)]

    first, second = (
        OutputSink(path, app_id, schema, store=lake.store),
        OutputSink(path, app_id, schema, store=lake.store),
    )
    assert first.commit(batch(first, [1, 2], 5), 5)
    assert not second.commit(batch(second, [1, 2], 5), 5), "a replay of a committed batch landed again"
    with pytest.raises(FencedError):
        second.commit(batch(second, [3], 9), 9, planned_upper=0)  # planned before the first driver's commit

    table = mirror(s3_server, bucket, "lake/p/outputs/t", tmp_path / "t")
    log = DeltaLog(table).refresh()
    assert log.txns == {app_id: 5}
    assert sorted(read_rows(log).column("x").to_pylist()) == [1, 2]
    assert [p.name for p in table.glob("*.parquet")] == [Path(f).name for f in log.files], "a discarded file lingers"


def _start(lake_uri: str, name: str, env: dict[str, str]) -> subprocess.Popen:
    return zygote.popen(
        ["--lake", lake_uri, "start", name],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _status_from_server(server: S3Server, bucket: str, key: str) -> dict:
    try:
        return json.loads(server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except server.client().exceptions.NoSuchKey:
        return {}


@pytest.mark.spark
@pytest.mark.usefixtures("reclock_processes")
def test_generator_pipeline_into_an_s3_lake_sigkilled_and_restarted_lands_exactly_once(s3_server, tmp_path):
    bucket = s3_server.bucket()
    lake_uri = f"s3://{bucket}/prod"
    env = {**os.environ, **s3_server.environ, "PYSPARK_PYTHON": sys.executable}
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "killed", "lake": lake_uri, "engine": "spark", "max_batch": 10_000, "batch_interval": 0.2},
        spark={"small_batch_offsets": 0},  # every batch runs as Spark tasks writing into the store
        source={"kind": "generator", "partitions": 4, "rate": 20_000, "limit": 60_000},
    )
    assert reclock_in_process("create", str(config), env=env).returncode == 0
    job = _start(lake_uri, "killed", env)
    deadline = time.monotonic() + 180
    status: dict = {}
    while time.monotonic() < deadline and status.get("batches", 0) < 3:
        time.sleep(0.2)
        status = _status_from_server(s3_server, bucket, "prod/killed/status.json")
    assert status.get("batches", 0) >= 3, "the job never got going"
    os.killpg(job.pid, signal.SIGKILL)  # the driver and its Spark JVM, mid-run
    job.wait(timeout=PATIENCE_S)
    assert not status.get("finished")

    done = reclock_cli("--lake", lake_uri, "start", "killed", env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _status_from_server(s3_server, bucket, "prod/killed/status.json")["finished"]

    # From outside: every generated record in exactly one row, stamped by the durable bindings.
    copy = mirror(s3_server, bucket, "prod/killed", tmp_path / "mirror")
    remap = Remap.read(copy / "remap")
    for output, keys in expected_generator_offsets(4, 60_000).items():
        rows = read_rows(DeltaLog(copy / "outputs" / output).refresh(), ["_partition", "_offset", "_into_ts"])
        got = Counter(zip(rows.column("_partition").to_pylist(), rows.column("_offset").to_pylist(), strict=True))
        assert not [k for k, n in got.items() if n > 1], f"{output}: duplicated rows"
        assert set(got) == keys, f"{output}: missing {len(keys - set(got))}, unexpected {len(set(got) - keys)}"
        wrong = [r for r in rows.to_pylist() if not remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"])]
        assert not wrong, f"{output}: rows stamped against the bindings: {wrong[:3]}"
    assert read_rows(DeltaLog(copy / "outputs" / "_errors").refresh()).num_rows == 0

    # The read API and the CLI work on the same lake, and agree with the outside reader.
    lake = Lake.at(lake_uri, s3_server.storage_options)
    assert readable_upper(lake, "killed") == CLOSED_UPPER
    cut = read_as_of(lake_uri, "killed", 2**62, storage_options=s3_server.storage_options)
    assert {o: t.num_rows for o, t in cut.items()} == {
        o: (len(k) if o != "_errors" else 0)
        for o, k in {**expected_generator_offsets(4, 60_000), "_errors": set()}.items()
    }
    shown = reclock_in_process("--lake", lake_uri, "status", "killed", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["health"], row["finished"], row["readable_upper"], row["unreadable"]) == (
        "stopped",
        True,
        CLOSED_UPPER,
        None,
    )
    assert {o: n for o, (n, _) in row["outputs"].items()} == {o: t.num_rows for o, t in cut.items()}


def test_storage_credentials_stay_out_of_the_lake_the_status_and_the_output(s3_server, tmp_path):
    """A secret given as ``${NAME}`` in ``[storage_options]`` or ``--storage-option`` reaches the
    store and nothing else: no object on the server, no local state file, no line of output."""
    bucket = s3_server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    secret = s3_server.secret_access_key
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"S3_ENDPOINT": s3_server.endpoint, "S3_SECRET": secret})
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "quiet", "lake": lake_uri, "engine": "local"},
        storage_options={
            "endpoint": "${S3_ENDPOINT}",
            "region": "us-east-1",
            "access_key_id": s3_server.access_key_id,
            "secret_access_key": "${S3_SECRET}",
            "allow_http": "true",
        },
        source={"kind": "generator", "partitions": 2, "limit": 5_000},
    )
    created = reclock_in_process("create", str(config), env=env)
    assert created.returncode == 0, created.stderr
    flags = [
        "--lake",
        lake_uri,
        "--storage-option",
        "endpoint=${S3_ENDPOINT}",
        "--storage-option",
        "secret_access_key=${S3_SECRET}",
        "--storage-option",
        f"access_key_id={s3_server.access_key_id}",
        "--storage-option",
        "region=us-east-1",
        "--storage-option",
        "allow_http=true",
    ]
    outputs = [created]
    for command in (["start", "quiet"], ["status", "--json"], ["batches", "quiet"], ["errors", "quiet"]):
        done = reclock_in_process(*flags, *command, env=env)
        assert done.returncode == 0, done.stderr
        outputs.append(done)
    assert json.loads(outputs[2].stdout)[0]["finished"]
    for done in outputs:
        assert secret not in done.stdout + done.stderr

    stored = mirror(s3_server, bucket, "lake", tmp_path / "mirror")
    files = [p for p in stored.rglob("*") if p.is_file()]
    assert any(p.name == "definition.json" for p in files) and any(p.name == "status.json" for p in files)
    assert not [p for p in files if secret.encode() in p.read_bytes()]

    wrong = reclock_in_process("--lake", lake_uri, "--storage-option", "secret=${S3_SECRET}", "status", env=env)
    assert wrong.returncode == 2 and secret not in wrong.stderr
    assert "storage_options.secret: unknown storage option" in wrong.stderr


def test_a_files_pipeline_on_an_s3_lake_keeps_file_states_and_drop_file_in_the_store(s3_server, tmp_path, monkeypatch):
    """Dropped files' generations live in the store: a drop written by one command is what the next
    job reads, and the file is ingested once more as a new generation, nothing else twice."""
    bucket = s3_server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    env = {**os.environ, **s3_server.environ}
    folder = tmp_path / "in"
    sizes = write_numbered_csvs(folder, 3, lambda f: 4 + f)
    config = files_pipeline_config(tmp_path / "files.toml", folder, pipeline={"lake": lake_uri, "batch_interval": 0.05})
    assert reclock_in_process("create", str(config), env=env).returncode == 0
    for key, value in s3_server.environ.items():  # the job runs in this process, until its files are loaded
        monkeypatch.setenv(key, value)

    def loaded(*files: tuple[str, int]) -> bool:
        states = {(f.path, f.generation): f.state for f in file_states(Lake.at(lake_uri), "ingest")}
        return all(states.get(f) == "Loaded" for f in files)

    run_until(Lake.at(lake_uri), "ingest", lambda: loaded(*((p, 0) for p in sizes)), "every file Loaded")
    listed = reclock_in_process("--lake", lake_uri, "files", "ingest", "--json", env=env)
    assert {(r["path"], r["state"]) for r in json.loads(listed.stdout)} == {(p, "Loaded") for p in sizes}
    dropped = reclock_in_process("--lake", lake_uri, "drop-file", "ingest", "f01.csv", env=env)
    assert dropped.returncode == 0, dropped.stderr
    run_until(Lake.at(lake_uri), "ingest", lambda: loaded(("f01.csv", 1)), "f01.csv's generation 1 Loaded")

    copy = mirror(s3_server, bucket, "lake/ingest", tmp_path / "mirror")
    assert json.loads((copy / "control" / "generations.json").read_text()) == {"f01.csv": 1}
    rows = read_rows(DeltaLog(copy / "outputs" / "rows").refresh()).to_pylist()
    per_partition = Counter(r["_partition"] for r in rows)
    assert per_partition == {
        **{encode_partition((p, 0)): n for p, n in sizes.items()},
        encode_partition(("f01.csv", 1)): sizes["f01.csv"],
    }


@pytest.mark.usefixtures("reclock_processes")
def test_a_second_job_on_the_same_s3_lake_is_refused_and_a_killed_one_shows_dead(s3_server, tmp_path):
    """The job lease of an object-store lake is an object in it; a holder that died on this machine
    frees it at once, so here it works as on a local lake (tests/integration/test_lease_s3.py pins
    the takeover of a paused holder after expiry)."""
    lake_uri = f"s3://{s3_server.bucket()}/lake"
    env = {**os.environ, **s3_server.environ}
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "only", "lake": lake_uri, "engine": "local", "batch_interval": 0.1},
        source={"kind": "generator", "partitions": 2, "rate": 2_000},
    )
    assert reclock_in_process("create", str(config), env=env).returncode == 0
    job = _start(lake_uri, "only", env)
    try:
        deadline = time.monotonic() + 60
        while _status_from_server(s3_server, lake_uri.split("/")[2], "lake/only/status.json").get("batches", 0) < 2:
            assert time.monotonic() < deadline, "the job never got going"
            time.sleep(0.2)
        second = reclock_cli("--lake", lake_uri, "start", "only", env=env)  # a process: it might not be refused
        assert second.returncode == 1 and "is already running" in second.stderr
        running = json.loads(reclock_in_process("--lake", lake_uri, "status", "only", "--json", env=env).stdout)
        assert running[0]["health"] == "running"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=PATIENCE_S)
    dead = json.loads(reclock_in_process("--lake", lake_uri, "status", "only", "--json", env=env).stdout)
    assert dead[0]["health"] == "dead" and f"pid {job.pid}" in dead[0]["last_error"]


def _guide_blocks(fence: str, marker: str) -> list[str]:
    """The ``fence`` blocks of docs/object-storage.md that follow a line containing ``marker``
    (padded so that their lines keep their markdown line numbers in a traceback)."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / "object-storage.md").read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if marker in line and lines[i + 1].strip() == f"```{fence}":
            end = lines.index("```", i + 2)
            blocks.append("\n" * (i + 2) + "\n".join(lines[i + 2 : end]))
    return blocks


@pytest.mark.spark  # the guide's pipeline runs on the default engine
@pytest.mark.usefixtures("reclock_processes")
def test_the_object_storage_guide_recipes_run_against_the_server(s3_server, tmp_path, monkeypatch):
    """The guide's pipeline file and its as-of recipes, run as written against the test server."""
    client = s3_server.client()
    client.create_bucket(Bucket="analytics")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "S3_ENDPOINT": s3_server.endpoint,
        "S3_KEY_ID": s3_server.access_key_id,
        "S3_SECRET": s3_server.secret_access_key,
    }
    [toml] = _guide_blocks("toml", "illustrative: tests/integration/test_object_storage.py creates")
    (tmp_path / "orders.toml").write_text(toml)
    created = reclock_in_process("create", str(tmp_path / "orders.toml"), env=env)
    assert created.returncode == 0, created.stderr
    env.update(
        {
            "AWS_ACCESS_KEY_ID": s3_server.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_access_key,
            "AWS_REGION": "eu-west-1",
            "AWS_ENDPOINT_URL": s3_server.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }
    )
    done = reclock_cli("--lake", "s3://analytics/lakes/prod", "start", "orders", env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "S3_ENDPOINT"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("RECLOCK_LAKE", "s3://analytics/lakes/prod")
    recipes = _guide_blocks("python", "test_the_object_storage_guide_recipes_run_against_the_server")
    assert len(recipes) == 2
    namespace: dict = {}
    for recipe in recipes:
        exec(compile(recipe, "docs/object-storage.md", "exec"), namespace)
    expected = expected_generator_offsets(4, 20_000)
    assert {o: t.num_rows for o, t in namespace["tables"].items()} == {
        **{o: len(k) for o, k in expected.items()},
        "_errors": 0,
    }
    assert namespace["table"].num_rows == len(expected["bids"])
    assert namespace["label"] >= max(namespace["table"].column("_into_ts").to_pylist())


def test_a_status_read_while_its_job_rewrites_it_is_one_version_whole(s3_server):
    """A job rewrites ``status.json`` every batch while ``reclock status`` and the page read it. A
    read that took the object's size in one request and its bytes in another got the first bytes
    of a longer version written in between (a suite run saw a status cut before its closing
    brace). Here the read's GET is held at a proxy until a longer version has replaced the object:
    the read must be that version, whole."""
    proxy = FaultProxy(s3_server.port)
    try:
        bucket = s3_server.bucket()
        lake = Lake.at(f"s3://{bucket}/lake", {**s3_server.storage_options, "endpoint": proxy.endpoint})
        key = "lake/p/status.json"
        shorter = {"pipeline": "p", "health": "stopped", "batches": 1}
        longer = {**shorter, "batches": 2, "last_error": "a longer status " * 20}
        client = s3_server.client()
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(shorter).encode())
        proxy.hold(lambda head: head.startswith(b"GET ") and b"status.json" in head.split(b"\r\n")[0], 1.5)
        read: list = []
        reader = threading.Thread(target=lambda: read.append(read_status(lake, "p")))
        reader.start()
        time.sleep(0.5)  # the read's GET is held now (a two-request read has taken the size)
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(longer).encode())
        reader.join(PATIENCE_S)
        assert read == [longer]
    finally:
        proxy.close()


def test_an_upsert_output_in_an_s3_lake_merges_through_reclocks_writer(s3_server, tmp_path):
    """The MERGE reclock writes (issue 40) on the S3 server: a batch's updates, inserts and deletes
    of keys land once; every file holds the table's types; read back by mirroring the bucket."""
    from reclock.runtime.pipeline import Pipeline
    from reclock.sources.base import Output
    from reclock.testing import FakeClock, MemorySource
    from tests.delta_log import lake_file_schema_mismatches

    bucket = s3_server.bucket()
    lake = Lake.at(f"s3://{bucket}/lake", s3_server.storage_options)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    source = MemorySource({"kv": Output("kv", schema, ("id",), "upsert")})
    clock = FakeClock(1_000)
    source.append(0, "kv", [{"id": i, "name": f"n{i}"} for i in range(6)])
    Pipeline("p", lake, source, now=clock).step()
    clock.ms = 2_000
    source.append(0, "kv", [{"id": 1, "name": "again"}, {"id": 2, "name": None}, {"id": 9, "name": "new"}])
    Pipeline("p", lake, source, now=clock).step()  # a record of nulls only deletes its key
    table = mirror(s3_server, bucket, "lake/p/outputs/kv", tmp_path / "kv")
    rows = read_rows(DeltaLog(table).refresh())
    assert rows is not None
    got = {r["id"]: r["name"] for r in rows.to_pylist()}
    assert got == {0: "n0", 1: "again", 3: "n3", 4: "n4", 5: "n5", 9: "new"}
    assert lake_file_schema_mismatches(tmp_path / "kv") == []

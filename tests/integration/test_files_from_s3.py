"""Files from an object store: a files source over an ``s3://`` prefix of a real S3-compatible server
(moto's, its own process), with gzip-compressed files and a large file cut into pieces.

What lands is checked from outside: the lake's tables are read from the server with polars (its
own Delta reader, not the project's), against rows the test wrote itself.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reclock.job.lifecycle import file_states
from reclock.job.secrets import expand_storage_options
from reclock.persist.lake import Lake
from reclock.sources.files import FilesSource
from reclock.timeline.frontier import Frontier
from tests import zygote
from tests.cli import reclock_in_process
from tests.integration.helpers import expected_generator_offsets, write_config
from tests.integration.s3 import REGION, S3Server
from tests.waiting import PATIENCE_S, run_until

COLUMNS = {"id": "int64", "name": "string"}


def _delta_options(server: S3Server) -> dict[str, str]:
    """The server as polars and delta-rs name the options: what an outside reader is given."""
    return {
        "aws_endpoint_url": server.endpoint,
        "aws_region": REGION,
        "aws_access_key_id": server.access_key_id,
        "aws_secret_access_key": server.secret_access_key,
        "aws_allow_http": "true",
    }


def _rows_on_server(server: S3Server, uri: str) -> pl.DataFrame:
    """An output table as polars reads it from the server (empty before its first commit)."""
    try:
        return pl.read_delta(uri, storage_options=_delta_options(server))
    except Exception as exc:  # no table yet
        if "not a Delta table" in str(exc) or "No files in log segment" in str(exc) or "TableNotFound" in str(exc):
            return pl.DataFrame()
        raise


def _put(server: S3Server, bucket: str, objects: dict[str, bytes]) -> None:
    client = server.client()
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


def _start(lake_uri: str, name: str, env: dict[str, str]) -> subprocess.Popen:
    return zygote.popen(
        ["--lake", lake_uri, "start", name],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def test_an_s3_prefix_is_listed_page_by_page_without_hidden_files_and_read_like_a_folder(s3_server):
    """More keys than one listing page (1,000), hidden keys, other extensions, a glob, Parquet
    footers and a gzip file, all through ranged reads of the server."""
    bucket = s3_server.bucket()
    objects = {f"in/day-{i % 3}/f{i:04}.csv": f"id,name\n{i},n{i}\n".encode() for i in range(1005)}
    objects["in/day-0/big.jsonl.gz"] = gzip.compress(b"".join(b'{"id": %d}\n' % i for i in range(3000)))
    hidden = {"in/.staging/x.csv": b"id\n1\n", "in/day-1/.part-0.csv": b"id\n2\n", "in/readme.txt": b"not data"}
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(7)), "name": ["p"] * 7}), sink)
    objects["in/t.parquet"] = sink.getvalue().to_pybytes()
    _put(s3_server, bucket, {**objects, **hidden})

    source = FilesSource(path=f"s3://{bucket}/in", columns=COLUMNS, storage_options=s3_server.storage_options)
    upper = source.upper()
    assert {p for p, _ in upper.items()} == {(key.removeprefix("in/"), 0) for key in objects}
    assert upper.offset(("t.parquet", 0)) == 7 and upper.offset(("day-1/f0001.csv", 0)) == len(
        objects["in/day-1/f0001.csv"]
    )
    lower = Frontier()
    splits = source.splits(lower, source.cap(lower, upper, max_records=1))
    rows = {}
    for split in splits:
        for output, batch in source.read(split):
            assert output == "rows"
            rows.setdefault(split.partition[0], []).extend(batch.column("id").to_pylist())
    assert len(rows) == source.max_files_per_batch == 1000, "the cap takes max_files_per_batch files"
    assert all(ids == [int(path[-8:-4])] for path, ids in rows.items() if path.endswith(".csv")), rows

    [whole] = source.splits(lower, Frontier({("day-0/big.jsonl.gz", 0): upper.offset(("day-0/big.jsonl.gz", 0))}))
    assert [i for _, b in source.read(whole) for i in b.column("id").to_pylist()] == list(range(3000))
    [parquet] = source.splits(lower, Frontier({("t.parquet", 0): 7}))
    assert [i for _, b in source.read(parquet) for i in b.column("id").to_pylist()] == list(range(7))

    schemaless = FilesSource(
        path=f"s3://{bucket}/in/*.parquet", format="parquet", storage_options=s3_server.storage_options
    )
    assert schemaless.outputs()[0].schema == pa.schema([("id", pa.int64()), ("name", pa.string())])

    globbed = FilesSource(
        path=f"s3://{bucket}/in/day-[12]/*.csv", columns=COLUMNS, storage_options=s3_server.storage_options
    )
    assert {p for p, _ in globbed.upper().items()} == {
        (key.removeprefix("in/"), 0) for key in objects if key.startswith(("in/day-1/", "in/day-2/"))
    }


def test_a_missing_bucket_or_an_unknown_storage_option_fails_at_definition_naming_the_field(s3_server):
    from reclock.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        FilesSource(path="s3://no-such-bucket/in", columns=COLUMNS, storage_options=s3_server.storage_options)
    assert caught.value.field == "path" and "does not exist" in caught.value.reason
    with pytest.raises(ConfigError) as caught:
        FilesSource(path="s3://b/in", columns=COLUMNS, storage_options={"secret": s3_server.secret_access_key})
    assert caught.value.field == "storage_options.secret"
    assert s3_server.secret_access_key not in str(caught.value)


def test_an_s3_files_pipeline_keeps_loaded_and_skipped_states_and_drop_file_reads_a_file_again(
    s3_server, tmp_path, monkeypatch
):
    """SingleStore's S3 pipeline states: a corrupt .gz is Skipped with its reason, the others
    Loaded; ``drop-file`` makes the next job read one again, as a new generation. The files are
    in a bucket of their own, reached with the source's own ``storage_options`` (no ``AWS_*``
    environment at all), whose secret, given as ``${NAME}``, lands nowhere."""
    files, lake_bucket = s3_server.bucket(), s3_server.bucket()
    good = b"id,name\n" + b"".join(b"%d,good\n" % i for i in range(50))
    _put(
        s3_server,
        files,
        {
            "in/a.csv.gz": gzip.compress(good),
            "in/b.csv.gz": gzip.compress(good)[:40],  # truncated
            "in/c.jsonl": b"".join(b'{"id": %d, "name": "c"}\n' % i for i in range(30)),
        },
    )
    lake_uri = f"s3://{lake_bucket}/lake"
    secret = s3_server.secret_access_key
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "FSTORE_ENDPOINT": s3_server.endpoint,
        "FSTORE_SECRET": secret,
    }
    options = {
        "endpoint": "${FSTORE_ENDPOINT}",
        "region": REGION,
        "access_key_id": s3_server.access_key_id,
        "secret_access_key": "${FSTORE_SECRET}",
        "allow_http": "true",
    }
    config = write_config(
        tmp_path / "p.toml",
        pipeline={
            "name": "ingest",
            "lake": lake_uri,
            "engine": "local",
            "batch_interval": 0.05,
            "max_retries": 1,
            "retry_backoff": 0.01,
            "stop_on_error": False,
        },
        storage_options=options,
        source={"kind": "files", "path": f"s3://{files}/in", "columns": COLUMNS, "storage_options": options},
    )
    lake = ["--lake", lake_uri, *(a for k, v in options.items() for a in ("--storage-option", f"{k}={v}"))]
    said = [reclock_in_process("create", str(config), env=env)]
    assert said[-1].returncode == 0, said[-1].stderr
    for key in [k for k in os.environ if k.startswith("AWS_")]:  # the job runs in this process, as the CLI would
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    store = Lake.at(lake_uri, expand_storage_options(options))  # as `--storage-option` does

    def states_are(expected: dict[tuple[str, int], str]) -> bool:  # the files source never finishes
        states = {(f.path, f.generation): f.state for f in file_states(store, "ingest")}
        return all(states.get(k) == state for k, state in expected.items())

    first = {("a.csv.gz", 0): "Loaded", ("b.csv.gz", 0): "Skipped", ("c.jsonl", 0): "Loaded"}
    run_until(store, "ingest", lambda: states_are(first), "a.csv.gz and c.jsonl Loaded, b.csv.gz Skipped")
    said.append(reclock_in_process(*lake, "files", "ingest", "--json", env=env))
    states = {r["path"]: r for r in json.loads(said[-1].stdout)}
    assert {p: r["state"] for p, r in states.items()} == {
        "a.csv.gz": "Loaded",
        "b.csv.gz": "Skipped",
        "c.jsonl": "Loaded",
    }
    assert "b.csv.gz: cannot be decompressed as gzip" in states["b.csv.gz"]["reason"]
    said.append(reclock_in_process(*lake, "drop-file", "ingest", "a.csv.gz", env=env))
    assert said[-1].returncode == 0, said[-1].stderr
    run_until(store, "ingest", lambda: states_are({("a.csv.gz", 1): "Loaded"}), "a.csv.gz's generation 1 Loaded")
    said.append(reclock_in_process(*lake, "status", "ingest", "--json", env=env))

    rows = _rows_on_server(s3_server, f"{lake_uri}/ingest/outputs/rows")
    assert Counter(rows["_partition"].to_list()) == {'["a.csv.gz",0]': 50, '["a.csv.gz",1]': 50, '["c.jsonl",0]': 30}
    errors = _rows_on_server(s3_server, f"{lake_uri}/ingest/outputs/_errors")
    assert errors["_partition"].to_list() == ['["b.csv.gz",0]'] and errors["kind"].to_list() == ["skipped"]
    client = s3_server.client()
    stored = [
        client.get_object(Bucket=lake_bucket, Key=item["Key"])["Body"].read()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=lake_bucket)
        for item in page.get("Contents", [])
    ]
    assert stored and not [b for b in stored if secret.encode() in b], "the source's secret was stored in the lake"
    assert not [p for p in said if secret in p.stdout + p.stderr], "the source's secret was printed"


@pytest.mark.spark
@pytest.mark.usefixtures("reclock_processes")
def test_files_from_s3_some_gzipped_one_cut_into_pieces_sigkilled_and_restarted_land_exactly_once(s3_server, tmp_path):
    """Acceptance (issue 13, files): a files pipeline over an ``s3://`` prefix, some files gzip
    compressed and one large JSON lines file read by several Spark tasks, into an ``s3://`` lake;
    the job is SIGKILLed mid-run (driver and JVM) and restarted. Every row of every file is in the
    output exactly once, read back with polars from the server."""
    bucket = s3_server.bucket()
    expected: Counter = Counter()
    objects: dict[str, bytes] = {}
    for f in range(36):
        lines = [(f * 1000 + i, f"f{f}:{i}") for i in range(40 + f)]
        text = ("id,name\n" + "".join(f"{i},{n}\n" for i, n in lines)).encode()
        key = f"in/f{f:02}.csv" + (".gz" if f % 2 else "")
        objects[key] = gzip.compress(text) if f % 2 else text
        expected.update(n for _, n in lines)
    _put(s3_server, bucket, objects)
    time.sleep(1.1)  # newer than every other file (S3 times are in seconds): its batch runs after the kill
    big = [(10**6 + i, f"big:{i}" + "x" * (i % 90)) for i in range(20_000)]
    _put(s3_server, bucket, {"in/big.jsonl": "".join(json.dumps({"id": i, "name": n}) + "\n" for i, n in big).encode()})
    expected.update(n for _, n in big)

    lake_uri = f"s3://{bucket}/lake"
    env = {**os.environ, **s3_server.environ, "PYSPARK_PYTHON": sys.executable}
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "ingest", "lake": lake_uri, "engine": "spark", "batch_interval": 0.05},
        spark={"small_batch_offsets": 0},  # every batch runs as Spark tasks reading from the store
        source={
            "kind": "files",
            "path": f"s3://{bucket}/in",
            "columns": COLUMNS,
            "max_files_per_batch": 3,
            "split_bytes": 256 << 10,  # big.jsonl (about 1.6 MB) is read by about seven tasks
        },
    )
    assert reclock_in_process("create", str(config), env=env).returncode == 0, "create failed"
    output = f"{lake_uri}/ingest/outputs/rows"

    job = _start(lake_uri, "ingest", env)
    deadline = time.monotonic() + 300
    try:
        while _rows_on_server(s3_server, output).height == 0:
            assert time.monotonic() < deadline and job.poll() is None, "the job never landed a batch"
            time.sleep(0.5)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the driver and its Spark JVM, mid-run
        job.wait(timeout=PATIENCE_S)
    landed = _rows_on_server(s3_server, output).height
    assert 0 < landed < sum(expected.values()), "the kill was not mid-run"

    job = _start(lake_uri, "ingest", env)
    try:
        while _rows_on_server(s3_server, output).height < sum(expected.values()):
            assert time.monotonic() < deadline + 300 and job.poll() is None, "the restarted job did not finish"
            time.sleep(1)
    finally:
        assert reclock_in_process("--lake", lake_uri, "stop", "ingest", env=env).returncode == 0
        job.wait(timeout=120)

    rows = _rows_on_server(s3_server, output)
    got = Counter(rows["name"].to_list())
    assert not [n for n, k in got.items() if k > 1], "rows landed twice"
    assert got == expected, f"missing {len(set(expected) - set(got))}, unexpected {len(set(got) - set(expected))}"
    by_file = rows.group_by("_partition").agg(pl.col("_offset").max().alias("top"), pl.len().alias("n"))
    tops = dict(zip(by_file["_partition"].to_list(), by_file["top"].to_list(), strict=True))
    assert tops['["f01.csv.gz",0]'] > 0 and tops['["f02.csv",0]'] > 0, "every record has its own offset"
    assert rows.select("_partition", "_offset").is_unique().all(), "(_partition, _offset) names one record"
    assert _rows_on_server(s3_server, f"{lake_uri}/ingest/outputs/_errors").height == 0
    pieces = reclock_in_process("--lake", lake_uri, "batches", "ingest", "--json", "--limit", "0", env=env)
    assert pieces.returncode == 0, pieces.stderr
    big_rows = [r for r in json.loads(pieces.stdout) if r.get("partition") == '["big.jsonl",0]']
    assert len({r["earliest_offset"] for r in big_rows if r.get("state") == "Succeeded"}) > 1, big_rows[:3]


def _guide_blocks(marker: str) -> list[str]:
    """The python blocks of docs/object-storage.md that follow a line containing ``marker``
    (padded so that their lines keep their markdown line numbers in a traceback)."""
    lines = (Path(__file__).resolve().parents[2] / "docs" / "object-storage.md").read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if marker in line and lines[i + 1].strip() == "```python":
            end = lines.index("```", i + 2)
            blocks.append("\n" * (i + 2) + "\n".join(lines[i + 2 : end]))
    return blocks


def _orders_lake(server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The guide's ``orders`` pipeline run to its end in a bucket of its own, the environment the
    guide's recipes expect, and the namespace its first recipes leave (``lake``, ``T``, ...)."""
    lake_uri = f"s3://{server.bucket()}/lakes/prod"
    config = write_config(
        tmp_path / "orders.toml",
        pipeline={"name": "orders", "lake": lake_uri, "engine": "local"},
        source={"kind": "generator", "partitions": 4, "limit": 20_000},
    )
    env = {**os.environ, **server.environ}
    assert reclock_in_process("create", str(config), env=env).returncode == 0
    done = reclock_in_process("--lake", lake_uri, "start", "orders", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_access_key)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("S3_ENDPOINT", server.endpoint)
    monkeypatch.setenv("RECLOCK_LAKE", lake_uri)
    namespace: dict = {}
    for recipe in _guide_blocks("test_the_object_storage_guide_recipes_run_against_the_server"):
        exec(compile(recipe, "docs/object-storage.md", "exec"), namespace)
    return namespace


@pytest.mark.spark
def test_the_as_of_recipes_for_polars_and_spark_run_against_the_server(s3_server, tmp_path, monkeypatch, spark):
    namespace = _orders_lake(s3_server, tmp_path, monkeypatch)
    namespace["spark"] = spark
    recipes = _guide_blocks("test_the_as_of_recipes_for_polars_and_spark_run_against_the_server")
    assert len(recipes) == 2
    for recipe in recipes:
        exec(compile(recipe, "docs/object-storage.md", "exec"), namespace)
    bids = expected_generator_offsets(4, 20_000)["bids"]
    cut = namespace["polars_cut"]
    assert set(zip(cut["_partition"].to_list(), cut["_offset"].to_list(), strict=True)) == bids
    assert cut.height == len(bids)
    rows = namespace["spark_cut"].select("_partition", "_offset").collect()
    assert len(rows) == len(bids) and {(r["_partition"], r["_offset"]) for r in rows} == bids


def test_the_duckdb_as_of_recipe_runs_against_the_server(s3_server, tmp_path, monkeypatch):
    pytest.importorskip("duckdb_extension_delta", reason="the duckdb-extension-delta package is not installed")
    pytest.importorskip("duckdb_extension_httpfs", reason="the duckdb-extension-httpfs package is not installed")
    namespace = _orders_lake(s3_server, tmp_path, monkeypatch)
    [recipe] = _guide_blocks("test_the_duckdb_as_of_recipe_runs_against_the_server")
    exec(compile(recipe, "docs/object-storage.md", "exec"), namespace)
    bids = expected_generator_offsets(4, 20_000)["bids"]
    cut = namespace["duckdb_cut"]
    assert cut.num_rows == len(bids)
    assert set(zip(cut.column("_partition").to_pylist(), cut.column("_offset").to_pylist(), strict=True)) == bids

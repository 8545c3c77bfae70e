"""The Postgres source in a pipeline: snapshot plus stream, upsert and append outputs, errors.

Each test makes its own database on the session's server and runs a pipeline in the driver
(``LocalDataPlane``), then checks the Delta tables with the tests' own reader
(``tests.faults.reader``, no product code) against what the database holds.
"""

from __future__ import annotations

import threading
import time
from contextlib import closing
from pathlib import Path

import psycopg2
import pyarrow as pa
import pytest
from psycopg2.extras import LogicalReplicationConnection

from reclock.errors import ConfigError, DefiniteSourceError, TransientError
from reclock.persist.lake import Lake, sink_id
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.reports import BatchFailed
from reclock.sources.postgres import PostgresSource
from reclock.timeline.frontier import Frontier
from tests.faults.reader import DeltaLog, label_of, read_rows
from tests.waiting import PATIENCE_S


def make_source(postgres, database: str, tmp_path: Path, **options) -> PostgresSource:
    options = {"slot": f"s_{database}", "publication": f"p_{database}", "state_dir": str(tmp_path / "state"), **options}
    return PostgresSource(postgres.dsn(database), **options)


def execute(postgres, database: str, *statements: str) -> None:
    with closing(postgres.connect(database)) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def query(postgres, database: str, sql: str) -> list[tuple]:
    with closing(postgres.connect(database)) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def output_table(lake: Path, pipeline: str, output: str) -> pa.Table:
    log = DeltaLog(Lake.at(lake).output_path(pipeline, output)).refresh()
    rows = read_rows(log)
    assert rows is not None, output
    return rows


def drop_slot(postgres, database: str, slot: str) -> None:
    """Drop ``slot`` once no connection holds it: a reader whose batch just failed has closed its
    replication connection, but the server's walsender may take a moment to let the slot go (the
    suite saw "slot ... is active" here under load)."""
    deadline = time.monotonic() + PATIENCE_S
    while query(postgres, database, f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'") == [(True,)]:
        assert time.monotonic() < deadline, f"slot {slot} still held after 30 s"
        time.sleep(0.05)
    execute(postgres, database, f"SELECT pg_drop_replication_slot('{slot}')")


def test_snapshot_then_stream_mirror_the_tables_by_key(postgres, tmp_path):
    db = "mirror"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2), big text)",
        "ALTER TABLE accounts ALTER COLUMN big SET STORAGE EXTERNAL",
        "CREATE TABLE events (id bigint PRIMARY KEY, kind text, at timestamptz)",
        "INSERT INTO accounts SELECT g, 'o' || g, g * 1.5, NULL FROM generate_series(1, 500) g",
        "INSERT INTO events SELECT g, 'k', '2026-11-25 00:00:00+00' FROM generate_series(1, 50) g",
    )
    source = make_source(postgres, db, tmp_path, tables=["accounts", "public.events"], snapshot_chunk_pages=1)
    pipeline = Pipeline("pg", tmp_path / "lake", source)
    first = pipeline.step()  # the snapshot, bound whole
    assert first.rows["public_accounts"] == 500 and first.rows["public_events"] == 50
    assert len(source._captured().chunks) > 2  # several chunks (one page each) of accounts
    execute(
        postgres,
        db,
        "BEGIN; UPDATE accounts SET balance = balance - 10 WHERE id = 1; UPDATE accounts SET balance = balance + 10 "
        "WHERE id = 2; COMMIT",
        "INSERT INTO accounts VALUES (1000, 'new', 0, repeat('x', 30000))",
        "UPDATE accounts SET owner = 'renamed' WHERE id = 1000",  # leaves 'big' (TOASTed) unsent
        "DELETE FROM accounts WHERE id = 3",
        "UPDATE accounts SET id = 2000 WHERE id = 4",
        "BEGIN; INSERT INTO events VALUES (51, 'x', NULL); UPDATE events SET kind = 'y' WHERE id = 51; COMMIT",
        "DELETE FROM events WHERE id < 10",
    )
    pipeline.step()
    accounts = output_table(tmp_path / "lake", "pg", "public_accounts")
    got = {r["id"]: (r["owner"], r["balance"]) for r in accounts.to_pylist()}
    want = {r[0]: (r[1], r[2]) for r in query(postgres, db, "SELECT id, owner, balance FROM accounts")}
    errors = output_table(tmp_path / "lake", "pg", "_errors").to_pylist()
    # id 1000's rename left its TOASTed 'big' unsent, and it was inserted in an earlier
    # transaction of the batch: the MERGE keeps the value that insert wrote.
    assert errors == []
    assert got == want
    assert [r["big"] for r in accounts.to_pylist() if r["id"] == 1000] == ["x" * 30000]
    events = output_table(tmp_path / "lake", "pg", "public_events")
    assert sorted((r["id"], r["kind"]) for r in events.to_pylist()) == sorted(
        query(postgres, db, "SELECT id, kind FROM events")
    )
    drop_slot(postgres, db, source.options.slot)


def test_a_snapshot_of_values_with_line_breaks_and_quotes_is_the_table(postgres, tmp_path):
    """``COPY``'s CSV quotes a value holding a line break; a chunk with any quote is parsed with
    ``newlines_in_values``, one without is not. Values with breaks and quotes fill several of
    pyarrow's 1 MiB parse blocks, so a block boundary falls inside a quoted value: parsed without
    ``newlines_in_values`` such a chunk gives cut values or fails. The plain table beside it takes
    the other path."""
    db = "breaks"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE notes (id int PRIMARY KEY, body text)",
        "CREATE TABLE plain (id int PRIMARY KEY, body text)",
        "INSERT INTO notes SELECT g, repeat('line ' || g || E'\\n\\r\\n\"q\", ', 1 + g % 7) "
        "FROM generate_series(1, 30000) g",
        "INSERT INTO plain SELECT g, repeat('w' || g, 1 + g % 5) FROM generate_series(1, 30000) g",
    )
    source = make_source(postgres, db, tmp_path, tables=["notes", "plain"])
    pipeline = Pipeline("pg", tmp_path / "lake", source)
    pipeline.step()
    for table in ("notes", "plain"):
        landed = output_table(tmp_path / "lake", "pg", f"public_{table}")
        assert sorted((r["id"], r["body"]) for r in landed.to_pylist()) == sorted(
            query(postgres, db, f"SELECT id, body FROM {table}")
        ), table
    assert any("\n" in body for _, body in query(postgres, db, "SELECT id, body FROM notes WHERE id = 1"))
    drop_slot(postgres, db, source.options.slot)


def test_a_table_rewritten_after_the_snapshot_is_exported_is_captured_again_not_landed_empty(postgres, tmp_path):
    """A rewrite (TRUNCATE, VACUUM FULL, a retyping ALTER) gives a table a new file whose rows an
    older snapshot cannot see: PostgreSQL's rewrites are not MVCC-safe. One that commits between
    the slot's exported snapshot and a copy task's read would make the snapshot land the table
    empty, a cut the database never had at the slot's point. Here the plane's first run (the
    capture's landing ahead) truncates and refills the table after the export and before its copy tasks run: the capture
    must fail as transient and start over at a new slot, and the first cut is the table as it is."""
    db = "rewritten"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'old' FROM generate_series(1, 100) g",
    )

    class RewritingFirst(LocalDataPlane):
        rewrites = 1

        def run(self, plan, splits):  # the first run is the capture's landing ahead
            if self.rewrites:
                self.rewrites -= 1
                execute(
                    postgres,
                    db,
                    "BEGIN; TRUNCATE t; INSERT INTO t SELECT g, 'new' FROM generate_series(1000, 1049) g; COMMIT",
                )
            return super().run(plan, splits)

    source = make_source(postgres, db, tmp_path, tables=["t"])
    pipeline = Pipeline("pg", tmp_path / "lake", source, data_plane=RewritingFirst())
    with pytest.raises(TransientError, match="rewritten"):
        pipeline.step()
    pipeline.step()  # the capture again, at a new slot
    landed = output_table(tmp_path / "lake", "pg", "public_t")
    assert sorted((r["id"], r["v"]) for r in landed.to_pylist()) == sorted(query(postgres, db, "SELECT id, v FROM t"))
    drop_slot(postgres, db, source.options.slot)


def test_a_column_dropped_after_the_snapshot_is_exported_is_one_line_naming_the_table(postgres, tmp_path):
    """``DROP COLUMN`` rewrites nothing (the snapshot's check of the table's file passes), but the
    copy's query names the column the table had at the export, which the server no longer knows:
    a definite error (the stream would refuse the dropped column next anyway), said in one line
    naming the chunk and the table, not the server's text with its query and caret. Nothing is
    bound and no file of the landing stays."""
    db = "dropped"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a'), (2, 'b')")

    class DroppingFirst(LocalDataPlane):
        def run(self, plan, splits):  # the first run is the capture's landing ahead
            execute(postgres, db, "ALTER TABLE t DROP COLUMN v")
            return super().run(plan, splits)

    source = make_source(postgres, db, tmp_path, tables=["t"])
    pipeline = Pipeline("pg", tmp_path / "lake", source, data_plane=DroppingFirst())
    with pytest.raises(DefiniteSourceError) as failed:
        pipeline.step()
    message = str(failed.value)
    assert "\n" not in message and "chunk 0 of public.t" in message and 'column "v" does not exist' in message
    assert len(pipeline.remap.bindings) == 0
    assert not list((tmp_path / "lake" / "pg" / "outputs").rglob("*.parquet"))
    drop_slot(postgres, db, source.options.slot)


def test_one_transaction_lands_at_one_into_time_in_every_table(postgres, tmp_path):
    db = "onetime"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "CREATE TABLE b (id int PRIMARY KEY, v int)",
    )
    source = make_source(postgres, db, tmp_path, tables=["a", "b"], envelope="append")
    pipeline = Pipeline("pg", tmp_path / "lake", source)
    pipeline.step()
    execute(
        postgres,
        db,
        "BEGIN; INSERT INTO a VALUES (1, 1); INSERT INTO b VALUES (1, 1); UPDATE a SET v = 2 WHERE id = 1; COMMIT",
        "BEGIN; INSERT INTO b VALUES (2, 2); DELETE FROM a WHERE id = 1; COMMIT",
        "TRUNCATE a",
    )
    pipeline.step()
    a = output_table(tmp_path / "lake", "pg", "public_a").sort_by([("_offset", "ascending"), ("seq", "ascending")])
    b = output_table(tmp_path / "lake", "pg", "public_b").sort_by([("_offset", "ascending"), ("seq", "ascending")])
    assert [r["op"] for r in a.to_pylist()] == ["c", "u", "d", "t"]
    assert [r["after"] for r in a.to_pylist()][:2] == [{"id": 1, "v": 1}, {"id": 1, "v": 2}]
    assert a.column("before").to_pylist()[2] == {"id": 1, "v": None}  # a delete's old key
    first_txn = a.column("_offset")[0].as_py()
    assert b.column("_offset")[0].as_py() == first_txn  # one transaction, one source time
    assert a.column("commit_lsn").to_pylist()[:2] == [first_txn, first_txn]
    assert a.column("xid")[0] == b.column("xid")[0]
    assert len(set(a.column("_into_ts").to_pylist()[:2] + b.column("_into_ts").to_pylist()[:1])) == 1
    drop_slot(postgres, db, source.options.slot)


def test_refusals_are_one_line_naming_what_to_run(postgres, tmp_path):
    db = "refusals"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE nokey (v int)",
        "CREATE TABLE noident (id int PRIMARY KEY)",
        "ALTER TABLE noident REPLICA IDENTITY NOTHING",
    )
    with pytest.raises(ConfigError) as nokey:
        make_source(postgres, db, tmp_path, tables=["nokey"])
    assert 'ALTER TABLE "public"."nokey" REPLICA IDENTITY FULL' in str(nokey.value)
    with pytest.raises(ConfigError) as noident:
        make_source(postgres, db, tmp_path, tables=["noident"])
    assert "no usable replica identity" in str(noident.value)
    with pytest.raises(ConfigError, match="missing does not exist"):
        make_source(postgres, db, tmp_path, tables=["missing"])
    for error in (nokey.value, noident.value):
        assert "\n" not in str(error)


def test_a_dropped_slot_or_a_changed_table_is_a_definite_error(postgres, tmp_path):
    db = "definite"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    source = make_source(postgres, db, tmp_path, tables=["t"], read_timeout_s=5)
    pipeline = Pipeline("pg", tmp_path / "lake", source)
    pipeline.step()
    execute(postgres, db, "ALTER TABLE t ALTER COLUMN v TYPE int USING 0", "INSERT INTO t VALUES (1, 1)")
    # A task's error reaches the batch as a failed split of that kind: the pipeline fails at once.
    with pytest.raises(BatchFailed, match=r"DefiniteSourceError: table public\.t: column v is now of type OID 23"):
        pipeline.step()
    drop_slot(postgres, db, source.options.slot)
    with pytest.raises(BatchFailed, match=f"DefiniteSourceError: replication slot {source.options.slot} was dropped"):
        Pipeline("pg", tmp_path / "lake", source).step()


def test_the_committer_confirms_only_what_every_output_holds(postgres, tmp_path):
    db = "confirm"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY)")
    source = make_source(postgres, db, tmp_path, tables=["t"])
    pipeline = Pipeline("pg", tmp_path / "lake", source)
    pipeline.step()
    execute(postgres, db, "INSERT INTO t SELECT generate_series(1, 100)")
    pipeline.step()
    log = DeltaLog(Lake.at(tmp_path / "lake").output_path("pg", "public_t")).refresh()
    held = label_of(log, sink_id("pg", "public_t"))
    frontier = pipeline.remap.bindings.source_upper_at(held + 1).offset("wal")
    confirmed = query(
        postgres, db, f"SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 's_{db}'"
    )[0][0]
    assert int(confirmed) == frontier
    drop_slot(postgres, db, source.options.slot)


def test_the_committer_waits_for_a_slot_a_closing_reader_still_holds(postgres, tmp_path):
    """A batch's reader closes its replication connection just before the committer runs, and
    the server lets go of the slot a moment later (longer on a loaded machine): the confirmation
    must wait for it, not be skipped until the next batch."""
    db = "busy"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY)")
    source = make_source(postgres, db, tmp_path, tables=["t"])
    pipeline = Pipeline("pg", tmp_path / "lake", source)
    pipeline.step()
    execute(postgres, db, "INSERT INTO t SELECT generate_series(1, 100)")
    pipeline.step()
    execute(postgres, db, "INSERT INTO t SELECT generate_series(101, 200)")
    target = int(query(postgres, db, "SELECT pg_current_wal_flush_lsn() - '0/0'")[0][0])
    slot = f"SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = 's_{db}'"
    assert int(query(postgres, db, slot)[0][0]) < target

    holder = psycopg2.connect(postgres.dsn(db), connection_factory=LogicalReplicationConnection)
    holder.cursor().start_replication(
        slot_name=source.options.slot, decode=False, options={"proto_version": "1", "publication_names": f"p_{db}"}
    )
    release = threading.Timer(1.0, holder.close)
    release.start()
    try:
        source.commit(Frontier({"wal": target}))
    finally:
        release.join()
    assert int(query(postgres, db, slot)[0][0]) == target
    drop_slot(postgres, db, source.options.slot)


GUIDE = Path(__file__).resolve().parents[3] / "docs" / "sources" / "postgres.md"


def test_the_guides_definition_creates_a_pipeline(postgres, tmp_path):
    """The guide's TOML, pointed at the test server, is a definition ``reclock create`` takes; its
    refusal message is the one the source gives."""
    import re
    import tomllib

    from reclock.job.config import build_source, parse_config

    db = "guide"
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE checking (id int PRIMARY KEY, balance bigint)",
        "CREATE TABLE savings (id int PRIMARY KEY, balance bigint)",
        "CREATE TABLE nokey (v int)",
    )
    text = GUIDE.read_text()
    (example,) = re.findall(r"## A first pipeline\n.*?```toml\n(.*?)```", text, re.DOTALL)
    definition = tomllib.loads(example)
    definition["source"]["dsn"] = postgres.dsn(db)
    config = parse_config(definition)
    source = build_source(config, created_at_ms=0, state_path=str(tmp_path / "state"))
    assert isinstance(source, PostgresSource)
    assert [o.name for o in source.outputs()] == ["public_checking", "public_savings"]
    assert source.options.slot == source.options.publication == "reclock_bank"
    definition["source"]["tables"] = ["nokey"]
    with pytest.raises(ConfigError) as refused:
        build_source(parse_config(definition), created_at_ms=0)
    (documented,) = re.findall(r"```text\n(source\.tables: .*?)\n```", text, re.DOTALL)
    assert str(refused.value) == documented


def test_a_server_restart_stalls_the_pipeline_then_it_resumes_exactly(postgres, tmp_path):
    """The server goes away (fast shutdown) under a running pipeline: it is ``stalled``, not
    failed, and once the server is back every change lands exactly once (append: one row each)."""
    import threading
    import time

    from reclock.runtime.health import Health
    from reclock.runtime.settings import Settings

    db = "restart"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    source = make_source(postgres, db, tmp_path, tables=["t"], envelope="append", read_timeout_s=3)
    settings = Settings(batch_interval=0.1, idle_interval=0.5, retry_backoff=0.1, max_backoff=0.5)
    pipeline = Pipeline("pg", tmp_path / "lake", source, settings=settings)
    stop = threading.Event()
    runner = threading.Thread(target=pipeline.run, kwargs={"stop": stop}, daemon=True)
    runner.start()
    try:
        for i in range(1, 51):
            execute(postgres, db, f"INSERT INTO t VALUES ({i}, {i})")
        postgres.stop()
        deadline = time.monotonic() + 60
        while pipeline.health != Health.STALLED:
            assert time.monotonic() < deadline and pipeline.health != Health.FAILED, pipeline.last_error
            time.sleep(0.05)
        assert "Postgres server" in (pipeline.last_error or "")
        postgres.start()
        execute(postgres, db, "UPDATE t SET v = v + 100 WHERE id <= 25", "DELETE FROM t WHERE id > 40")
        flushed = int(query(postgres, db, "SELECT pg_current_wal_flush_lsn() - '0/0'")[0][0])
        deadline = time.monotonic() + 60
        while pipeline.resume_frontier().offset("wal") < flushed:
            assert time.monotonic() < deadline and pipeline.health != Health.FAILED, pipeline.last_error
            time.sleep(0.05)
    finally:
        stop.set()
        runner.join(timeout=60)
        if postgres.process is None:
            postgres.start()
    rows = output_table(tmp_path / "lake", "pg", "public_t").to_pylist()
    changes = sorted((r["_offset"], r["seq"]) for r in rows)
    assert len(changes) == len(set(changes)) == 50 + 25 + 10  # every change once
    state: dict[int, int] = {}
    for r in sorted(rows, key=lambda r: (r["_offset"], r["seq"])):
        if r["op"] == "d":
            del state[r["before"]["id"]]
        else:
            state[r["after"]["id"]] = r["after"]["v"]
    assert state == dict(query(postgres, db, "SELECT id, v FROM t"))
    drop_slot(postgres, db, source.options.slot)

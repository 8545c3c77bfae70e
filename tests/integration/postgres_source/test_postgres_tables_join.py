"""A table that joins the publication while the pipeline runs becomes an output, without stopping
the others (issue 22, acceptance 3: "a new table in the publication appears as an output").

Each test makes its own database on the session's server and steps a pipeline over ``a`` and
``b`` whose definition also takes the whole publication (``tables = ["a", "b", "*"]``); then
``c`` is created, filled and added to the publication, and written in transactions that also
touch ``a``. Everything is checked from outside with the tests' own Delta log reader
(``tests.faults.reader``): every output equals its table row for row, ``c``'s first labelled
version is empty and one below the binding that holds its copy, a cut at any label is a
database state (a transaction that moves value between ``a`` and ``c`` is never half in it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reclock.persist.asof import read_as_of, readable_upper
from reclock.persist.lake import Lake, sink_id
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.sources.postgres.source import PostgresSource
from tests import zygote
from tests.faults.reader import DeltaLog, Remap, label_of, read_rows
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source, query
from tests.waiting import PATIENCE_S

OUTPUTS = ("public_a", "public_b", "public_c")
TOTAL = 1_000  # a.v + c.v of id 1 once c exists: transactions move value between them


def _log(lake: Path, output: str) -> DeltaLog:
    return DeltaLog(Lake.at(lake).output_path("pg", output)).refresh()


def _rows(lake: Path, output: str) -> list[tuple]:
    """The output's rows as (id, v), sorted: a duplicate key shows as two tuples."""
    rows = read_rows(_log(lake, output))
    assert rows is not None, output
    return sorted((r["id"], r["v"]) for r in rows.to_pylist())


def _table(postgres, db: str, table: str) -> list[tuple]:
    return sorted(query(postgres, db, f"SELECT id, v FROM {table}"))


def _labelled_versions(lake: Path, output: str) -> list[tuple[int, int, int]]:
    """``(version, label, files added)`` of every commit of the output that carries its label."""
    path = Lake.at(lake).output_path("pg", output) / "_delta_log"
    out = []
    for commit in sorted(path.glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        labels = [a["txn"]["version"] for a in actions if "txn" in a and a["txn"]["appId"] == sink_id("pg", output)]
        if labels:
            out.append((int(commit.stem), labels[0], sum("add" in a for a in actions)))
    return out


def _rows_at_label(lake: Path, output: str, label: int) -> list[tuple] | None:
    """The output's rows at its first version whose label reached ``label`` (``None``: no such version)."""
    path = Lake.at(lake).output_path("pg", output)
    log = DeltaLog(path)
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if line.strip():
                log._apply(json.loads(line))
        log.version = int(commit.stem)
        if label_of(log, sink_id("pg", output)) is not None and label_of(log, sink_id("pg", output)) >= label:
            rows = read_rows(log)
            assert rows is not None
            return sorted((r["id"], r["v"]) for r in rows.to_pylist()) if rows.num_rows else []
    return None


def _setup(postgres, db: str) -> None:
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "CREATE TABLE b (id int PRIMARY KEY, v int)",
        f"INSERT INTO a SELECT g, CASE WHEN g = 1 THEN {TOTAL} ELSE g END FROM generate_series(1, 50) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 20) g",
    )


def _source(postgres, db: str, tmp_path: Path, **options) -> PostgresSource:
    return make_source(postgres, db, tmp_path, tables=["a", "b", "*"], snapshot_chunk_pages=2, **options)


def _join_c(postgres, db: str, rows: int = 2_000) -> None:
    """``c`` created and filled outside the publication, then added, then written with ``a``."""
    execute(
        postgres,
        db,
        "CREATE TABLE c (id int PRIMARY KEY, v int)",
        f"INSERT INTO c SELECT g, CASE WHEN g = 1 THEN 0 ELSE g END FROM generate_series(1, {rows}) g",
        f"ALTER PUBLICATION p_{db} ADD TABLE c",
        # After J, before the copy's consistent point: in the copy, and skipped in the stream.
        "BEGIN; UPDATE a SET v = v - 10 WHERE id = 1; UPDATE c SET v = v + 10 WHERE id = 1; "
        f"INSERT INTO c VALUES ({rows + 1}, 1); DELETE FROM c WHERE id = 2; COMMIT",
    )


def _write_more(postgres, db: str, round: int) -> None:
    """Transactions on a, b and c after c joined: value moves between a and c whole; c's rows
    from the copy are updated, deleted and re-keyed."""
    execute(
        postgres,
        db,
        "BEGIN; UPDATE a SET v = v - 7 WHERE id = 1; UPDATE c SET v = v + 7 WHERE id = 1; "
        f"UPDATE c SET v = -{round} WHERE id = 3; DELETE FROM c WHERE id = {10 + round}; COMMIT",
        f"INSERT INTO b VALUES ({100 + round}, {round})",
        f"BEGIN; INSERT INTO c VALUES ({5_000 + round}, {round}); UPDATE a SET v = -{round} WHERE id = 2; "
        f"UPDATE c SET id = id + 10000 WHERE id = {20 + round}; COMMIT",
    )


def _check_mirrors(postgres, db: str, lake: Path) -> None:
    for table, output in zip("abc", OUTPUTS, strict=True):
        assert _rows(lake, output) == _table(postgres, db, table), output


def _check_join(lake: Path, before_join_label: int) -> int:
    """c's first labelled version is empty, one below the binding that holds its copy; every
    output holds that binding at one label; returns that binding's time ``T_join``."""
    versions = _labelled_versions(lake, "public_c")
    (_, empty_label, added), (_, join_label, join_added) = versions[:2]
    assert added == 0 and join_added > 0
    assert empty_label == join_label - 1
    assert empty_label >= before_join_label  # no binding before the join holds anything of c
    remap = Remap.read(Lake.at(lake).remap_path("pg"))
    assert remap.frontier_at(join_label).get("snapshot:public.c", 0) > 0
    assert remap.frontier_at(before_join_label).get("snapshot:public.c", 0) == 0
    for output in ("public_a", "public_b"):
        assert join_label in [label for _, label, _ in _labelled_versions(lake, output)], output
    return join_label


def _check_cuts(lake: Path) -> None:
    """At every label of c, a's and c's rows at that label keep a.v + c.v of id 1 at TOTAL."""
    for _, label, _ in _labelled_versions(lake, "public_c"):
        c = dict(_rows_at_label(lake, "public_c", label) or [])
        a = dict(_rows_at_label(lake, "public_a", label) or [])
        if c:
            assert a[1] + c[1] == TOTAL, label


def test_a_table_joining_the_publication_becomes_an_output_at_one_binding(postgres, tmp_path):
    db = "joins"
    _setup(postgres, db)
    lake = tmp_path / "lake"
    source = _source(postgres, db, tmp_path)
    pipeline = Pipeline("pg", lake, source)
    pipeline.step()  # the snapshot of a and b
    execute(
        postgres, db, "BEGIN; UPDATE a SET v = 0 WHERE id = 5; INSERT INTO b VALUES (21, 21); COMMIT", "DELETE FROM b"
    )
    pipeline.step()
    assert not Lake.at(lake).output_path("pg", "public_c").exists()
    before = label_of(_log(lake, "public_a"), sink_id("pg", "public_a"))
    assert before is not None
    _join_c(postgres, db)
    pipeline.step()  # the probe copies c; the binding holds the copy; c is born and lands
    assert "public_c" in pipeline.sinks
    _check_mirrors(postgres, db, lake)
    t_join = _check_join(lake, before)
    for round in (1, 2):
        _write_more(postgres, db, round)
        pipeline.step()
        _check_mirrors(postgres, db, lake)
    _check_cuts(lake)
    # a and b went on at every binding: their labels are the pipeline's every batch.
    labels = {o: [label for _, label, _ in _labelled_versions(lake, o)] for o in OUTPUTS}
    assert labels["public_a"] == labels["public_b"]
    assert labels["public_c"][1:] == [t for t in labels["public_a"] if t >= t_join]
    # Read as of a time before c joined: c is empty; at its join: the copy, consistent with a.
    assert read_as_of(lake, "pg", t_join - 1)["public_c"].num_rows == 0
    assert read_as_of(lake, "pg", before)["public_c"].num_rows == 0
    at_join = read_as_of(lake, "pg", t_join)
    c = {r["id"]: r["v"] for r in at_join["public_c"].to_pylist()}
    a = {r["id"]: r["v"] for r in at_join["public_a"].to_pylist()}
    assert a[1] + c[1] == TOTAL and 2 not in c and 2_001 in c
    assert readable_upper(lake, "pg") > t_join
    # reclock status lists c, with its rows.
    from reclock.cli.status import _pipeline_status

    status = _pipeline_status(Lake.at(lake), "pg")
    assert status["outputs"]["public_c"][0] == len(_table(postgres, db, "c"))
    # A restart keeps c (its spec pinned in its manifest), adds no second copy, and goes on.
    source.close()
    again = Pipeline("pg", lake, _source(postgres, db, tmp_path))
    assert "public_c" in again.sinks
    _write_more(postgres, db, 3)
    again.step()
    _check_mirrors(postgres, db, lake)
    assert len([j for j in (tmp_path / "state" / "joins").iterdir()]) == 1
    drop_slot(postgres, db, again.source.options.slot)  # type: ignore[attr-defined]


class _Killed(BaseException):
    """The process dies here (never caught by the pipeline's handlers)."""


class _DyingPlane(LocalDataPlane):
    """Runs batches as the driver's plane does; of work outside batches (a table's copy), copies
    the first chunk, then the process dies."""

    def map(self, fn, items):
        fn(items[0])
        raise _Killed


@pytest.mark.parametrize("crash", ["capture", "manifest", "minted", "born:public_c", "committed:public_a"])
def test_a_crash_anywhere_in_the_join_converges_to_exactly_once(postgres, tmp_path, crash):
    """Killed inside the copy (some chunks written, no manifest), after the manifest before any
    binding holds it, after the binding before c is born, after c's empty version, and between
    two outputs' commits of the join's batch: a restart converges to the same outputs."""
    db = f"joinkill_{crash.split(':')[0]}"
    _setup(postgres, db)
    lake = tmp_path / "lake"
    source = _source(postgres, db, tmp_path)
    pipeline = Pipeline("pg", lake, source)
    pipeline.step()
    before = label_of(_log(lake, "public_a"), sink_id("pg", "public_a"))
    assert before is not None
    _join_c(postgres, db)
    state = tmp_path / "state"
    if crash == "capture":
        with pytest.raises(_Killed):
            Pipeline("pg", lake, source, data_plane=_DyingPlane()).step()
        assert list((state / "chunks").glob("join-*-public_c.parquet"))  # the copy had begun
        assert not (state / "joins").exists() or not list((state / "joins").iterdir())
    elif crash == "manifest":
        source.upper()  # the probe copied c and wrote its manifest; no binding holds it yet
        assert (state / "joins" / "public_c.json").exists()
    else:

        def die(step: str) -> None:
            if step == crash:
                raise _Killed

        dying = Pipeline("pg", lake, source, on_step=die)
        with pytest.raises(_Killed):
            dying.step()
    # More writes while the pipeline is down, then a restart.
    execute(postgres, db, "BEGIN; UPDATE a SET v = v - 1 WHERE id = 1; UPDATE c SET v = v + 1 WHERE id = 1; COMMIT")
    restarted = Pipeline("pg", lake, _source(postgres, db, tmp_path))
    restarted.step()
    while restarted.pending:
        restarted.step()
    _write_more(postgres, db, 2)
    restarted.step()
    _check_mirrors(postgres, db, lake)
    _check_join(lake, before)
    _check_cuts(lake)
    assert len(list((state / "joins").iterdir())) == 1
    if crash == "capture":  # the dead attempt's chunk files went before the second copy
        manifest = json.loads((state / "joins" / "public_c.json").read_text())
        named = {Path(c[1]).name for c in manifest["chunks"]}
        assert {p.name for p in (state / "chunks").glob("join-*-public_c.parquet")} == named
    drop_slot(postgres, db, restarted.source.options.slot)  # type: ignore[attr-defined]


def test_a_joined_tables_changes_below_its_copy_are_not_streamed_twice(postgres, tmp_path):
    """Under ``append`` every change is a row, so a change both in the copy and in the stream
    would show twice: the changes of c committed after it joined the publication but before its
    copy's consistent point are in its ``r`` rows only; those after are change rows, once each."""
    db = "joinappend"
    _setup(postgres, db)
    lake = tmp_path / "lake"
    source = _source(postgres, db, tmp_path, envelope="append")
    pipeline = Pipeline("pg", lake, source)
    pipeline.step()
    _join_c(postgres, db, rows=300)
    pipeline.step()
    _write_more(postgres, db, 1)
    pipeline.step()
    consistent = json.loads((tmp_path / "state" / "joins" / "public_c.json").read_text())["consistent_lsn"]
    rows = read_rows(_log(lake, "public_c"))
    assert rows is not None
    changes = rows.sort_by([("_into_ts", "ascending"), ("_offset", "ascending"), ("seq", "ascending")]).to_pylist()
    copied = [r for r in changes if r["op"] == "r"]
    streamed = [r for r in changes if r["op"] != "r"]
    # The copy: the table at C (id 1 moved 10, 301 inserted, 2 deleted before C), one row per key.
    assert {r["after"]["id"]: r["after"]["v"] for r in copied} == {
        **{i: i for i in range(3, 301)},
        1: 10,
        301: 1,
    }
    assert len(copied) == 300 and {r["commit_lsn"] for r in copied} == {consistent}
    # The stream: only what committed at or after C, each change once.
    assert streamed and all(r["commit_lsn"] >= consistent for r in streamed)
    assert len({(r["commit_lsn"], r["seq"]) for r in streamed}) == len(streamed)
    mirror: dict[int, int] = {}
    for r in changes:
        if r["before"] is not None and r["op"] in ("u", "d"):
            mirror.pop(r["before"]["id"], None)
        if r["after"] is not None:
            mirror[r["after"]["id"]] = r["after"]["v"]
    assert sorted(mirror.items()) == _table(postgres, db, "c")
    drop_slot(postgres, db, source.options.slot)


def test_a_running_job_lands_a_joining_table_and_status_lists_it(postgres, tmp_path):
    """The same through ``reclock create`` and ``reclock start``: a definition with
    ``tables = ["a", "b", "*"]``, c added to the publication while the job runs."""
    import os
    import subprocess
    import sys
    import time

    from tests.integration.helpers import reclock_cli, write_config

    db = "joinjob"
    _setup(postgres, db)
    config = write_config(
        tmp_path / "job.toml",
        pipeline={"name": "pg", "lake": "lake", "engine": "local", "batch_interval": 0.2, "idle_interval": 1.0},
        source={
            "kind": "postgres",
            "dsn": postgres.dsn(db),
            "tables": ["a", "b", "*"],
            "slot": f"s_{db}",
            "publication": f"p_{db}",
            "read_timeout_s": 10.0,
        },
    )
    created = reclock_cli("create", str(config), cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    lake = tmp_path / "lake"

    def until(what, seconds: float = 90):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if what():
                    return
            except (AssertionError, FileNotFoundError, KeyError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"not reached in {seconds} s: {(tmp_path / 'job.err').read_text()[-2000:]}")

    with open(tmp_path / "job.err", "ab") as err:
        job = zygote.popen(
            ["--lake", str(lake), "start", "pg"],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        until(lambda: _rows(lake, "public_a") == _table(postgres, db, "a"))
        _join_c(postgres, db)
        _write_more(postgres, db, 1)
        until(lambda: all(_rows(lake, o) == _table(postgres, db, t) for t, o in zip("abc", OUTPUTS, strict=True)))
        status = reclock_cli("--lake", str(lake), "status", "pg", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "public_c" in status.stdout, status.stdout
        assert reclock_cli("--lake", str(lake), "stop", "pg", "--wait", f"{PATIENCE_S:.0f}").returncode == 0
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    _check_join(lake, 0)
    _check_cuts(lake)
    drop_slot(postgres, db, f"s_{db}")

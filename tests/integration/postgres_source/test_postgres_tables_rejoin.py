"""A table that left the publication and is added again joins again with a fresh copy: its output
goes on, and from the return's into time on it equals the table again (rows deleted while it was
out do not survive), while a read as of any time before the removal, during the absence and after
the return is the table as it was then.

Against the session's server. The test records its own ground truth (the tables' rows after each
step, which the step's one binding holds whole) and reads the outputs with the tests' own reader
(``tests.faults.reader``: pyarrow over the ``_delta_log``), at every label the outputs carry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reclock.errors import DefiniteSourceError
from reclock.persist.lake import Lake, sink_id
from reclock.runtime.pipeline import Pipeline
from reclock.sources.postgres.pgoutput import parse_lsn
from reclock.sources.postgres.source import WAL
from reclock.timeline.frontier import Frontier
from tests.faults.reader import DeltaLog, label_of, read_rows
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source, query
from tests.integration.postgres_source.test_postgres_tables_join import _labelled_versions, _rows, _table


def _setup(postgres, db: str) -> None:
    """``a`` named by the definition, ``b`` taken by ``"*"`` alone (an initial table that may leave)."""
    postgres.create_database(db)
    execute(
        postgres,
        db,
        "CREATE TABLE a (id int PRIMARY KEY, v int)",
        "CREATE TABLE b (id int PRIMARY KEY, v int)",
        "INSERT INTO a SELECT g, g FROM generate_series(1, 10) g",
        "INSERT INTO b SELECT g, g FROM generate_series(1, 50) g",
        f"CREATE PUBLICATION p_{db} FOR TABLE a, b",
    )


def _versions(lake: Path, output: str) -> list[tuple[int, list[dict]]]:
    """``(label, rows)`` at every labelled version of the output, oldest first."""
    path = Lake.at(lake).output_path("pg", output)
    out = []
    for version, _, _ in _labelled_versions(lake, output):
        log = DeltaLog(path)
        for v in range(version + 1):
            for line in (path / "_delta_log" / f"{v:020d}.json").read_text().splitlines():
                if line.strip():
                    log._apply(json.loads(line))
        log.version = version
        rows = read_rows(log)
        assert rows is not None
        out.append((label_of(log, sink_id("pg", output)), rows.to_pylist()))
    return out


def _as_of(versions: list[tuple[int, list[dict]]], time: int) -> list[dict] | None:
    """The rows at the first version whose label reached ``time``, those with ``_into_ts <= time``
    (``None``: no version reached it)."""
    for label, rows in versions:
        if label >= time:
            return [r for r in rows if r["_into_ts"] <= time]
    return None


def _step(pipeline: Pipeline, postgres, db: str, truth: dict[int, dict[str, list[tuple]]], b_now=None) -> int:
    """One step; its label's truth: ``a`` and ``b`` as the database has them now (``b_now``:
    what ``b``'s output should hold instead, while ``b`` is out)."""
    pipeline.step()
    label = pipeline.resume_upper - 1
    truth[label] = {"a": _table(postgres, db, "a"), "b": b_now if b_now is not None else _table(postgres, db, "b")}
    return label


def _check_cuts(lake: Path, truth: dict[int, dict[str, list[tuple]]]) -> None:
    """Every recorded label (each step's one binding: a cut of upsert outputs) reads its truth."""
    versions = {t: _versions(lake, f"public_{t}") for t in "ab"}
    for label, tables in truth.items():
        for t in "ab":
            rows = _as_of(versions[t], label)
            assert rows is not None, (t, label)
            assert sorted((r["id"], r["v"]) for r in rows) == tables[t], (t, label)


def test_a_table_back_in_the_publication_joins_again_and_its_output_equals_it(postgres, tmp_path):
    db = "rejoins"
    _setup(postgres, db)
    lake = tmp_path / "lake"

    def source():
        return make_source(postgres, db, tmp_path, tables=["a", "*"], snapshot_chunk_pages=1)

    pipeline = Pipeline("pg", lake, source())
    truth: dict[int, dict[str, list[tuple]]] = {}
    _step(pipeline, postgres, db, truth)
    execute(postgres, db, "BEGIN; UPDATE a SET v = -1 WHERE id = 1; UPDATE b SET v = -1 WHERE id = 1; COMMIT")
    _step(pipeline, postgres, db, truth)
    # b leaves; while it is out, rows are deleted, updated and inserted: none of it streams.
    execute(postgres, db, "UPDATE b SET v = 0 WHERE id = 2", f"ALTER PUBLICATION p_{db} DROP TABLE b")
    at_removal = _table(postgres, db, "b")
    ((removed,),) = query(postgres, db, "SELECT pg_current_wal_insert_lsn()")
    execute(postgres, db, "DELETE FROM b WHERE id <= 5", "UPDATE b SET v = 100 WHERE id = 6")
    _step(pipeline, postgres, db, truth, at_removal)
    execute(postgres, db, "INSERT INTO b VALUES (60, 60)", "DELETE FROM b WHERE id BETWEEN 20 AND 30")
    execute(postgres, db, "UPDATE a SET v = -2 WHERE id = 2")
    away = _step(pipeline, postgres, db, truth, at_removal)
    assert pipeline.source.warnings() and "public.b left" in pipeline.source.warnings()[0]
    # b comes back: a fresh copy (several chunks) replaces its output's rows at one into time.
    execute(postgres, db, f"ALTER PUBLICATION p_{db} ADD TABLE b", "UPDATE b SET v = 7 WHERE id = 7")
    back = _step(pipeline, postgres, db, truth)
    assert _rows(lake, "public_b") == _table(postgres, db, "b")
    assert not pipeline.source.warnings()
    # A returning copy is never bound with the table's changes from before its removal: a binding
    # whose WAL lower is below the removal's point stops there, without the copy.
    (rejoined,) = [j for j in pipeline.source.joins if j.rejoin == 1]
    removal = next(left.lsn for left in pipeline.source.leaves if left.output == "public_b")
    assert removal >= parse_lsn(removed)
    probe = Frontier({WAL: rejoined.consistent_lsn + 100, rejoined.partition: rejoined.upper})
    assert pipeline.source.cap(Frontier({WAL: removal - 1}), probe, 1) == Frontier({WAL: removal})
    assert pipeline.source.cap(Frontier({WAL: removal}), probe, 1) == probe
    # It streams again, in transactions whole with a.
    for i in range(2):
        execute(postgres, db, f"BEGIN; UPDATE a SET v = {i} WHERE id = 3; DELETE FROM b WHERE id = {40 + i}; COMMIT")
        _step(pipeline, postgres, db, truth)
    # Out and back once more, across a restart: the second return replaces it again.
    execute(postgres, db, f"ALTER PUBLICATION p_{db} DROP TABLE b")
    at_second_removal = _table(postgres, db, "b")
    _step(pipeline, postgres, db, truth, at_second_removal)
    execute(postgres, db, "DELETE FROM b WHERE id > 45", "INSERT INTO b VALUES (70, 70)")
    pipeline = Pipeline("pg", lake, source())
    _step(pipeline, postgres, db, truth, at_second_removal)
    execute(postgres, db, f"ALTER PUBLICATION p_{db} ADD TABLE b", "UPDATE b SET v = 8 WHERE id = 8")
    _step(pipeline, postgres, db, truth)
    execute(postgres, db, "BEGIN; UPDATE a SET v = 9 WHERE id = 4; UPDATE b SET v = 9 WHERE id = 9; COMMIT")
    _step(pipeline, postgres, db, truth)
    assert _rows(lake, "public_a") == _table(postgres, db, "a")
    assert _rows(lake, "public_b") == _table(postgres, db, "b")
    # The return's version replaced b's rows: none stamped before it survive in it.
    versions = _versions(lake, "public_b")
    at_back = _as_of(versions, back)
    assert at_back is not None and {r["_into_ts"] for r in at_back} == {back}
    during = _as_of(versions, away)
    assert during is not None and sorted((r["id"], r["v"]) for r in during) == at_removal
    _check_cuts(lake, truth)
    drop_slot(postgres, db, f"s_{db}")


def test_a_returning_table_in_an_append_output_records_a_truncate_then_its_copy(postgres, tmp_path):
    db = "rejoinsappend"
    _setup(postgres, db)
    lake = tmp_path / "lake"
    pipeline = Pipeline("pg", lake, make_source(postgres, db, tmp_path, tables=["a", "*"], envelope="append"))
    pipeline.step()
    execute(postgres, db, "UPDATE b SET v = -1 WHERE id = 1", f"ALTER PUBLICATION p_{db} DROP TABLE b")
    pipeline.step()
    execute(postgres, db, "DELETE FROM b WHERE id <= 10", "UPDATE b SET v = 100 WHERE id = 11")
    pipeline.step()
    execute(postgres, db, f"ALTER PUBLICATION p_{db} ADD TABLE b")
    pipeline.step()
    back = pipeline.resume_upper - 1
    execute(postgres, db, "DELETE FROM b WHERE id = 12", "INSERT INTO b VALUES (99, 99)")
    pipeline.step()
    rows = read_rows(DeltaLog(Lake.at(lake).output_path("pg", "public_b")).refresh())
    assert rows is not None
    changes = sorted(rows.to_pylist(), key=lambda r: (r["_into_ts"], r["_offset"], r["seq"]))
    # At the return: one truncate, then the copy's rows, the table as it was then.
    returned = [r for r in changes if r["_into_ts"] == back]
    assert returned[0]["op"] == "t" and returned[0]["before"] is None and returned[0]["after"] is None
    assert {r["op"] for r in returned[1:]} == {"r"}
    assert sorted((r["after"]["id"], r["after"]["v"]) for r in returned[1:]) == [
        (i, 100 if i == 11 else i) for i in range(11, 51)
    ]
    # Replaying every change in order gives the table.
    table: dict[int, int] = {}
    for r in changes:
        if r["op"] == "t":
            table.clear()
        elif r["op"] == "d":
            table.pop(r["before"]["id"], None)
        else:
            table[r["after"]["id"]] = r["after"]["v"]
    assert sorted(table.items()) == _table(postgres, db, "b")
    drop_slot(postgres, db, f"s_{db}")


def test_a_table_back_with_other_columns_is_a_definite_error_naming_it(postgres, tmp_path):
    db = "rejoinsaltered"
    _setup(postgres, db)
    lake = tmp_path / "lake"
    pipeline = Pipeline("pg", lake, make_source(postgres, db, tmp_path, tables=["a", "*"]))
    pipeline.step()
    execute(postgres, db, f"ALTER PUBLICATION p_{db} DROP TABLE b")
    pipeline.step()
    at_removal = _rows(lake, "public_b")
    execute(postgres, db, "ALTER TABLE b ALTER COLUMN v TYPE text", f"ALTER PUBLICATION p_{db} ADD TABLE b")
    with pytest.raises(DefiniteSourceError, match=rf"^table public\.b is in publication p_{db} again") as caught:
        pipeline.step()
    assert "\n" not in str(caught.value) and 'DROP TABLE "public"."b"' in str(caught.value)
    assert "output public_b" in str(caught.value)
    assert _rows(lake, "public_b") == at_removal
    drop_slot(postgres, db, f"s_{db}")

"""An upsert output is appended to, not merged into, exactly when the MERGE could only insert.

The condition (:meth:`~reclock.runtime.pipeline.Pipeline._appends`): the source promises that the
batch's records of the output are inserts of distinct keys
(:class:`~reclock.sources.base.DistinctInserts`, a database's initial snapshot) and the output's
table holds no row. Then the batch is one labelled append of the tasks' own files; otherwise a
MERGE. Either way the rows equal a dictionary replay, exactly once under replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from reclock.errors import FencedError
from reclock.persist.data_files import write_data_file
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.sink import OutputSink, table_schema
from reclock.runtime.pipeline import Pipeline
from reclock.sources.base import DistinctInserts, Output, Split
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from reclock.timeline.frontier import INTO_TS

KV = pa.schema([("k", pa.int64()), ("v", pa.string())])
SNAPSHOT = "snapshot"  # the partition whose records the source promises are distinct inserts


class SnapshotSource(MemorySource, DistinctInserts):
    """Promises distinct inserts for a batch whose splits are all of partition ``snapshot``."""

    def __init__(self) -> None:
        super().__init__({"kv": Output("kv", KV, key=("k",), envelope="upsert")})

    def distinct_inserts(self, splits: Sequence[Split]) -> frozenset[str]:
        if splits and all(split.partition == SNAPSHOT for split in splits):
            return frozenset({"kv"})
        return frozenset()


def _operations(lake, output: str = "kv") -> list[str]:
    """The operation of each commit of ``output``, oldest first: ``MERGE`` for reclock's MERGE
    (a Delta ``WRITE`` whose custom metadata says ``reclock.commit = merge``)."""
    history = DeltaTable(str(Lake.at(lake).output_path("p", output))).history()
    return [
        "MERGE" if h.get("reclock.commit") == "merge" else h["operation"]
        for h in sorted(history, key=lambda h: h["version"])
    ]


def _rows(lake, output: str = "kv") -> dict[int, str]:
    got = read_table(DeltaTable(str(Lake.at(lake).output_path("p", output))))
    keys = got.column("k").to_pylist()
    assert len(set(keys)) == len(keys), "a key twice"
    return dict(zip(keys, got.column("v").to_pylist(), strict=True))


def _staged(lake) -> list[str]:
    staging = Lake.at(lake).output_path("p", "kv").parent / ".staging-kv"
    return sorted(p.name for p in staging.glob("*.parquet")) if staging.exists() else []


def test_distinct_inserts_into_an_empty_upsert_output_are_appended_then_later_batches_merge(tmp_path):
    source = SnapshotSource()
    clock = FakeClock(1000)
    pipeline = Pipeline("p", tmp_path, source, now=clock)
    source.append(SNAPSHOT, "kv", [{"k": k, "v": f"s{k}"} for k in range(5)])
    pipeline.step()
    assert _operations(tmp_path)[-1] == "WRITE"  # the snapshot: appended, no MERGE
    assert _rows(tmp_path) == {k: f"s{k}" for k in range(5)}
    assert _staged(tmp_path) == []
    # Promised again, but the table holds rows now: a MERGE (an append would duplicate key 1).
    source.append(SNAPSHOT, "kv", [{"k": 1, "v": "again"}])
    clock.ms = 2000
    pipeline.step()
    assert _operations(tmp_path)[-1] == "MERGE"
    assert _rows(tmp_path) == {0: "s0", 1: "again", 2: "s2", 3: "s3", 4: "s4"}


def test_a_batch_the_source_does_not_promise_is_merged_even_into_an_empty_table(tmp_path):
    source = SnapshotSource()
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000))
    source.append(SNAPSHOT, "kv", [{"k": 1, "v": "snap"}])
    source.append("stream", "kv", [{"k": 2, "v": "streamed"}])
    pipeline.step()
    assert _operations(tmp_path)[-1] == "MERGE"
    assert _rows(tmp_path) == {1: "snap", 2: "streamed"}


def test_an_appended_batch_replayed_after_a_crash_lands_once(tmp_path):
    source = SnapshotSource()
    source.append(SNAPSHOT, "kv", [{"k": k, "v": f"s{k}"} for k in range(4)])
    crashing = Pipeline("p", tmp_path, source, now=FakeClock(1000), on_step=CrashAt("committed:kv"))
    with pytest.raises(SimulatedCrash):
        crashing.step()
    assert _rows(tmp_path) == {k: f"s{k}" for k in range(4)}
    again = Pipeline("p", tmp_path, source, now=FakeClock(2000))
    again.step()  # the pending batch: kv holds it (skipped), _errors gets its label
    again.step()
    assert _rows(tmp_path) == {k: f"s{k}" for k in range(4)}
    assert _operations(tmp_path).count("WRITE") == 1


def test_a_crash_before_the_commit_leaves_nothing_and_the_replay_appends(tmp_path):
    source = SnapshotSource()
    source.append(SNAPSHOT, "kv", [{"k": k, "v": f"s{k}"} for k in range(4)])
    crashing = Pipeline("p", tmp_path, source, now=FakeClock(1000), on_step=CrashAt("written"))
    with pytest.raises(SimulatedCrash):
        crashing.step()
    assert _rows(tmp_path) == {}
    Pipeline("p", tmp_path, source, now=FakeClock(2000)).step()
    assert _rows(tmp_path) == {k: f"s{k}" for k in range(4)}
    assert _operations(tmp_path)[-1] == "WRITE"


def test_an_append_planned_on_an_empty_table_that_gained_rows_is_refused_and_its_files_removed(tmp_path):
    path = tmp_path / "kv"
    schema = table_schema(KV, lineage=False)
    sink = OutputSink(path, "p/kv", schema, envelope="upsert", key=("k",))
    assert sink.can_append()
    rows = pa.table({"k": [1], "v": ["mine"], INTO_TS: [1000]}, schema=schema)
    written = write_data_file(path, "kv", rows)
    write_deltalake(str(path), pa.table({"k": [1], "v": ["theirs"], INTO_TS: [999]}, schema=schema), mode="append")
    with pytest.raises(FencedError):
        sink.commit([written], 1000, append=True)
    assert not (path / written.path).exists()
    assert not sink.can_append()
    assert read_table(DeltaTable(str(path))).column("v").to_pylist() == ["theirs"]


def test_a_delete_in_a_batch_promised_as_inserts_fails_it_as_a_broken_contract(tmp_path):
    source = SnapshotSource()
    source.append(SNAPSHOT, "kv", [{"k": 1, "v": "a"}, {"k": 2, "v": None}])  # v null only: a delete
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000))
    with pytest.raises(Exception) as failed:
        pipeline.step()
    assert "promised inserts of distinct keys" in str(failed.value)
    assert _rows(tmp_path) == {}

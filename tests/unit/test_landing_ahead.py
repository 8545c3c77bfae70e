"""A batch landed ahead of its binding (:mod:`reclock.runtime.ahead`): read once, bound at the time
reserved for it, committed from the files the landing wrote, exactly once through crashes.

The source here reads its ``snapshot`` partition only between the probe that asks the runtime to
land it (:class:`~reclock.sources.base.LandFirst`) and the probe that hears the answer, as a
database's exported snapshot is readable only while the connection that exported it lives: a
second read of it fails the test. What it keeps "durably" is a dictionary that outlives the
pipelines built on it; what the runtime landed is kept in the runtime's own state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from reclock.errors import DefiniteSourceError, TransientError
from reclock.persist.lake import Lake
from reclock.runtime.pipeline import Pipeline
from reclock.sources.base import Answer, AsksFirst, DistinctInserts, LandFirst, Output, Probe, Split
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from reclock.timeline.frontier import INTO_TS, Frontier

KV = pa.schema([("k", pa.int64()), ("v", pa.string())])
SNAPSHOT, STREAM = "snapshot", "stream"


class OnceSource(MemorySource, DistinctInserts, AsksFirst):
    """``snapshot`` readable only while its landing is asked for; ``kept``: its durable state."""

    def __init__(self, kept: dict, rows: int = 6, *, crash_after_keeping: bool = False, fail: bool = False) -> None:
        super().__init__(
            {
                "kv": Output("kv", KV, key=("k",), envelope="upsert"),
                "log": Output("log", KV),
            },
            max_split_offsets=2,
        )
        self.kept = kept
        self.append(SNAPSHOT, "kv", [{"k": k, "v": f"s{k}"} for k in range(rows)])
        self.append(SNAPSHOT, "log", [{"k": k, "v": f"l{k}"} for k in range(rows)])
        self.readable = False
        self.reads = 0
        self.crash_after_keeping = crash_after_keeping
        self.fail = fail

    def distinct_inserts(self, splits: Sequence[Split]) -> frozenset[str]:
        return frozenset({"kv"}) if splits and all(s.partition == SNAPSHOT for s in splits) else frozenset()

    def probe(self, answer: Answer | None) -> Probe:
        snapshot = Frontier({SNAPSHOT: len(self._log[SNAPSHOT])})
        self.readable = False  # answered (the landing is durable) or given up: the snapshot goes
        if answer is not None:
            self.kept["landed"] = answer.landed
            if self.crash_after_keeping:
                raise SimulatedCrash("after keeping the landing")
        if "landed" not in self.kept:
            self.readable = True
            return Probe(land_first=LandFirst(snapshot, tuple(self.splits(Frontier(), snapshot))))
        return Probe(upper=super().upper())

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        if split.partition == SNAPSHOT:
            if not self.readable:
                raise DefiniteSourceError(f"the snapshot is gone: {split!r} read again")
            if self.fail and split.start > 0:
                raise TransientError("the server went away")
            self.reads += split.end - split.start
        yield from super().read(split)


def _table(lake: Path, output: str) -> DeltaTable:
    return DeltaTable(str(Lake.at(lake).output_path("p", output)))


def _rows(lake: Path, output: str) -> list[tuple]:
    """The output's rows read by delta-rs (not reclock's reader), sorted."""
    got = _table(lake, output).to_pyarrow_table()
    columns = [got.column(name).to_pylist() for name in ("k", "v", INTO_TS)]
    return sorted(zip(*columns, strict=True))


def _parquet_files(lake: Path, output: str) -> set[str]:
    root = Lake.at(lake).output_path("p", output)
    return {str(p.relative_to(root)) for p in Path(root).rglob("*.parquet")}


def _expected(into_ts: int, rows: int = 6) -> dict[str, list[tuple]]:
    return {
        "kv": [(k, f"s{k}", into_ts) for k in range(rows)],
        "log": [(k, f"l{k}", into_ts) for k in range(rows)],
    }


def test_a_landing_ahead_is_read_once_bound_at_its_reserved_time_and_committed_as_written(tmp_path):
    kept: dict = {}
    source = OnceSource(kept)
    clock = FakeClock(5_000)
    pipeline = Pipeline("p", tmp_path, source, now=clock)
    pipeline.step()
    assert kept["landed"] == (2,) * 6  # the answer: each split's records, landed
    assert source.reads == 12  # each record once, in the probe; the batch read none again
    assert [t for t, _ in pipeline.remap.bindings] == [5_000]  # the time reserved for the landing
    for output, rows in _expected(5_000).items():
        assert _rows(tmp_path, output) == rows
        table = _table(tmp_path, output)
        writes = [
            "MERGE" if h.get("reclock.commit") == "merge" else h["operation"]
            for h in table.history()
            if h["operation"] in ("WRITE", "MERGE")
        ]
        assert writes == ["WRITE"]  # one commit, an append (the upsert output had no row: no MERGE)
        assert {Path(u).name for u in table.file_uris()} == _parquet_files(tmp_path, output)  # no other file
    # Streamed records after it land as any batch.
    source.append(STREAM, "log", [{"k": 9, "v": "later"}])
    clock.ms = 6_000
    pipeline.step()
    assert _rows(tmp_path, "log")[-1] == (9, "later", 6_000)


@pytest.mark.parametrize("crash", ["kept", "minted", "committed:kv"])
def test_a_crash_after_the_landing_is_kept_commits_its_files_exactly_once_at_its_time(tmp_path, crash):
    kept: dict = {}
    clock = FakeClock(5_000)
    first = OnceSource(kept, crash_after_keeping=crash == "kept")
    hook = None if crash == "kept" else CrashAt(crash)
    with pytest.raises(SimulatedCrash):
        Pipeline("p", tmp_path, first, now=clock, on_step=hook).step()
    written = {output: _parquet_files(tmp_path, output) for output in ("kv", "log")}
    clock.ms = 60_000  # the restart is much later: the binding keeps the reserved time
    second = OnceSource(kept)
    pipeline = Pipeline("p", tmp_path, second, now=clock)
    pipeline.step()
    assert second.reads == 0  # the snapshot was not read again: it could not be
    assert [t for t, _ in pipeline.remap.bindings] == [5_000]
    for output, rows in _expected(5_000).items():
        assert _rows(tmp_path, output) == rows
        assert _parquet_files(tmp_path, output) == written[output]  # no file written after the landing


@pytest.mark.parametrize("crash", ["landed-ahead", "kept-ahead"])
def test_a_crash_inside_the_landing_binds_nothing_and_the_next_probe_lands_again(tmp_path, crash):
    """Killed once the tasks wrote the files, before the runtime kept the landing, or after it kept
    it but before the source heard: the source, never answered, asks again; the new landing
    replaces the old, at which nothing was bound."""
    kept: dict = {}
    with pytest.raises(SimulatedCrash):
        Pipeline("p", tmp_path, OnceSource(kept), now=FakeClock(5_000), on_step=CrashAt(crash)).step()
    assert kept == {}
    orphans = _parquet_files(tmp_path, "log")
    assert orphans  # written, never committed
    again = OnceSource(kept)
    pipeline = Pipeline("p", tmp_path, again, now=FakeClock(7_000))
    pipeline.step()
    assert again.reads == 12
    assert [t for t, _ in pipeline.remap.bindings] == [7_000]
    for output, rows in _expected(7_000).items():
        assert _rows(tmp_path, output) == rows  # once: the first attempt's files are in no table
    assert not orphans & {Path(u).name for u in _table(tmp_path, "log").file_uris()}


def test_maintenance_spares_the_files_of_a_landing_not_yet_committed(tmp_path):
    kept: dict = {}
    with pytest.raises(SimulatedCrash):
        Pipeline("p", tmp_path, OnceSource(kept, crash_after_keeping=True), now=FakeClock(5_000)).step()
    pipeline = Pipeline("p", tmp_path, OnceSource(kept), now=FakeClock(9_000))
    report = pipeline.maintain()  # history_minutes = 0: a vacuum would delete every unreferenced file
    assert report.vacuumed == {}
    pipeline.step()
    for output, rows in _expected(5_000).items():
        assert _rows(tmp_path, output) == rows
        for uri in _table(tmp_path, output).file_uris():
            assert pq.read_metadata(uri).num_rows > 0
    assert pipeline.maintain().vacuumed  # once committed, vacuum runs again


def test_a_landing_that_fails_discards_its_files_and_says_why(tmp_path):
    kept: dict = {}
    pipeline = Pipeline("p", tmp_path, OnceSource(kept, fail=True), now=FakeClock(5_000))
    with pytest.raises(TransientError, match=r"landed ahead of its binding failed: .*the server went away"):
        pipeline.step()
    assert kept == {} and len(pipeline.remap.bindings) == 0
    assert _parquet_files(tmp_path, "kv") == set() and _parquet_files(tmp_path, "log") == set()

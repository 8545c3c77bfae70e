"""Maintenance on real Delta tables: fewer files, the same answers, and writers still fenced.

Every check compares against a twin lake that ran the very same batches without maintenance,
read with the product's as-of reader and, for whole tables, with the independent log reader of
the fault suite (:mod:`tests.faults.reader`).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.errors import FencedError
from reclock.persist.asof import read_as_of, readable_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import RemapTable
from reclock.persist.sink import OutputSink, table_schema
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Maintenance, Settings
from reclock.sources.base import Output
from reclock.testing import FakeClock, MemorySource
from tests.faults.reader import DeltaLog, read_rows

#: Minutes of commits and nothing to wait on: run beside the Spark tests, whose session is shorter
#: than the pool's (scripts/test).
pytestmark = pytest.mark.beside_spark

OUTPUTS = {
    "clicks": Output("clicks", pa.schema([("user", pa.int64()), ("n", pa.int64())])),
    "scores": Output("scores", pa.schema([("user", pa.int64()), ("n", pa.int64())]), envelope="upsert", key=("user",)),
}

# Per batch: (partition, user, n) records, each to both outputs.
batches = st.lists(
    st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 4), st.integers(0, 99)), max_size=4),
    min_size=2,
    max_size=10,
)


def _drive(lake, script, maintain_after: set[int], policy: Maintenance) -> tuple[Pipeline, FakeClock, list[int]]:
    """Run ``script`` one batch per tick; maintain after the ticks in ``maintain_after``."""
    source = MemorySource(OUTPUTS)
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", lake, source, settings=Settings(idle_interval=0.0), maintenance=policy, now=clock)
    maintained_at = []
    for tick, records in enumerate(script, start=1):
        clock.ms = 1000 * tick
        for partition, user, n in records:
            source.append(partition, "clicks", [{"user": user, "n": n}])
            source.append(partition, "scores", [{"user": user, "n": n}])
        pipeline.step()
        if tick in maintain_after:
            pipeline.maintain()
            maintained_at.append(pipeline.resume_upper)
    return pipeline, clock, maintained_at


def _rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))


@settings(max_examples=12, deadline=None)
@given(script=batches, points=st.sets(st.integers(1, 10), max_size=3), history=st.sampled_from([0, 1000]))
def test_every_as_of_read_inside_the_history_window_is_unchanged_by_maintenance(
    tmp_path_factory, script, points, history
):
    """Compaction, optimize and vacuum at any points: every cut reads as in the twin lake.

    With a history window long enough nothing a read needs is vacuumed, so every cut is equal.
    With no history (``history_minutes = 0``) append outputs are still exact at every cut (they are
    read at their latest version), and an upsert output is exact at every cut after the last
    maintenance; older ones are *refused* with a clear error, never answered from other files.
    """
    plain = tmp_path_factory.mktemp("plain")
    kept = tmp_path_factory.mktemp("kept")
    _drive(plain, script, set(), Maintenance(every=0))
    _, _, maintained_at = _drive(kept, script, points, Maintenance(every=0, history_minutes=history))
    upper = readable_upper(plain, "pipe")
    assert readable_upper(kept, "pipe") == upper
    window_start = maintained_at[-1] if maintained_at and history == 0 else 0
    refused = 0
    for as_of in range(500, upper, 500):
        want = read_as_of(plain, "pipe", as_of)
        try:
            got = read_as_of(kept, "pipe", as_of)
        except ValueError as exc:
            assert as_of < window_start and "removed by maintenance" in str(exc), exc
            refused += 1
            continue
        assert {name: _rows(t) for name, t in got.items()} == {name: _rows(t) for name, t in want.items()}
    assert refused <= len(range(500, window_start, 500))
    for name in Lake.at(kept).outputs("pipe"):  # whole tables, read independently of the product
        outside = read_rows(DeltaLog(Lake.at(kept).output_path("pipe", name)).refresh())
        inside = read_rows(DeltaLog(Lake.at(plain).output_path("pipe", name)).refresh())
        assert _rows(outside) == _rows(inside)
    assert RemapTable(Lake.at(kept).remap_path("pipe")).files <= 1 + len(script)


def test_maintenance_leaves_one_file_per_table_and_the_pipeline_resumes_exactly(tmp_path):
    """After compaction the same batches land with the same ``_into_ts`` as in a twin lake, a
    reopened pipeline resumes where it was, and every table is back to one live file."""
    script = [[(0, 1, i), (1, 2, i)] for i in range(30)]
    _drive(tmp_path / "plain", script, set(), Maintenance(every=0))
    pipeline, clock, _ = _drive(tmp_path / "kept", script, set(), Maintenance(every=10, history_minutes=0))
    lake = Lake.at(tmp_path / "kept")
    remap = RemapTable(lake.remap_path("pipe"))
    assert remap.bindings.since == 30_000  # compacted at batch 30: everything below the resume upper 30,001
    for name in ("clicks", "scores"):
        assert len(DeltaTable(str(lake.output_path("pipe", name))).file_uris()) == 1
    reopened = Pipeline("pipe", lake, pipeline.source, settings=Settings(idle_interval=0.0), now=clock)
    assert reopened.resume_upper == pipeline.resume_upper == 30_001
    assert reopened.resume_frontier() == pipeline.resume_frontier()
    clock.ms = 31_000
    pipeline.source.append(0, "clicks", [{"user": 9, "n": 9}])
    reopened.step()
    row = [r for r in read_rows(DeltaLog(lake.output_path("pipe", "clicks")).refresh()).to_pylist() if r["user"] == 9]
    assert [r["_into_ts"] for r in row] == [31_000]
    plain = read_rows(DeltaLog(Lake.at(tmp_path / "plain").output_path("pipe", "clicks")).refresh())
    kept = read_rows(DeltaLog(lake.output_path("pipe", "clicks")).refresh()).filter(pa.compute.field("user") != 9)
    assert _rows(kept) == _rows(plain)


def test_an_upsert_output_read_before_the_history_window_is_refused_not_guessed(tmp_path):
    script = [[(0, 1, i)] for i in range(5)]  # the same key, updated every batch
    pipeline, _, _ = _drive(tmp_path, script, set(), Maintenance(every=0, history_minutes=0))
    assert read_as_of(tmp_path, "pipe", 2000)["scores"]["n"].to_pylist() == [1]
    pipeline.maintain()
    with pytest.raises(
        ValueError, match=r"output 'scores' cannot be read as of 2000: the log or files of that version were removed"
    ):
        read_as_of(tmp_path, "pipe", 2000)
    assert read_as_of(tmp_path, "pipe", 5000)["scores"]["n"].to_pylist() == [4]


def test_a_writer_racing_a_long_running_pipeline_is_still_refused(tmp_path):
    """Kept-open snapshots and maintenance do not weaken compare-and-append or the labels: a
    second writer on the remap table or an output, with a view older than the job's, loses."""
    script = [[(0, 1, i)] for i in range(250)]  # past two checkpoints, with two maintenances
    pipeline, clock, _ = _drive(tmp_path, script, set(), Maintenance(every=100, history_minutes=0))
    lake = Lake.at(tmp_path)
    stale_remap = RemapTable(lake.remap_path("pipe"))
    schema = table_schema(OUTPUTS["clicks"].schema)
    stale_sink = OutputSink(lake.output_path("pipe", "clicks"), sink_id("pipe", "clicks"), schema)
    clock.ms = 251_000
    pipeline.source.append(0, "clicks", [{"user": 7, "n": 7}])
    pipeline.step()  # the job moves on: both stale views are now behind
    assert not stale_remap.mint(251_000, stale_remap.bindings.frontier.join(pipeline.remap.bindings.frontier))
    assert list(stale_remap.bindings)[-1] == list(pipeline.remap.bindings)[-1]  # adopted, not rebound
    with pytest.raises(FencedError):
        stale_sink.commit([], 260_000, planned_upper=250_001)
    assert stale_sink.commit([], 251_000) is False  # a replay of the job's batch: skipped
    labels = DeltaTable(str(lake.output_path("pipe", "clicks"))).transaction_version(sink_id("pipe", "clicks"))
    assert labels == 251_000
    clock.ms = 252_000
    pipeline.source.append(0, "clicks", [{"user": 8, "n": 8}])
    pipeline.step()  # and the job itself is not disturbed by the losers
    assert pipeline.resume_upper == 252_001


def test_the_expired_log_is_still_dropped_at_every_hundredth_version_of_a_batch_commit(tmp_path):
    """reclock asks delta-rs to look for expired log entries only at a checkpoint's commit that ends
    a run of 100 versions (:mod:`reclock.persist.post_commit`; its tables checkpoint every 10): the
    log stays bounded as at delta-rs's default interval, and is listed for expired entries ten times
    less often than checkpoints come. With a retention of 0 minutes, every entry older than the
    newest checkpoint is gone after versions 99 and 199, and the entries of the checkpoints in
    between stay until then."""
    script = [[(0, 1, i)] for i in range(3)]
    pipeline, clock, _ = _drive(tmp_path, script, set(), Maintenance(every=0, history_minutes=0))
    pipeline.maintain()  # the retention properties: 0 minutes
    path = Lake.at(tmp_path).output_path("pipe", "clicks")
    log = path / "_delta_log"

    def versions(suffix: str) -> list[int]:
        return sorted(int(p.name.split(".")[0]) for p in log.iterdir() if p.name.endswith(suffix))

    looks = []
    for tick in range(4, 210):
        clock.ms = 1000 * tick
        pipeline.source.append(0, "clicks", [{"user": 1, "n": tick}])
        pipeline.step()
        newest = versions(".json")[-1]
        checkpoint = max(versions(".checkpoint.parquet"))
        if newest % 10 == 9:  # delta-rs checkpoints versions 9, 19, ... at an interval of 10
            assert checkpoint == newest, f"no checkpoint at version {newest}"
            kept = versions(".json")
            if newest % 100 == 99:
                assert kept[0] >= checkpoint, f"the log before checkpoint {checkpoint} was kept: {kept}"
                looks.append(newest)
            elif newest > 100:
                assert kept[0] <= newest - 9, f"the log was looked at for expired entries at version {newest}"
    assert looks == [99, 199]
    assert sorted(read_as_of(tmp_path, "pipe", clock.ms)["clicks"]["n"].to_pylist()) == [0, 1, 2, *range(4, 210)]


def test_an_as_of_read_opens_each_output_once_and_moves_it_to_the_version_it_reads(tmp_path, monkeypatch):
    """An output's newest version gives both the readable upper and the table an upsert output's
    search moves between versions: each output was opened three times, and an upsert output once
    more for every version the search looked at and for the one it kept (each open a store client
    and a log listing, requests on an object store)."""
    from reclock.persist.store import Store

    lake = tmp_path / "lake"
    _drive(lake, [[(0, 1, 1)], [(0, 1, 2)], [(1, 2, 3)], [(0, 1, 4)]], set(), Maintenance(every=0))
    opened: list[tuple[str, int | None]] = []
    open_table = Store.open_table

    def counted(self, path, version=None):
        opened.append((str(path), version))
        return open_table(self, path, version)

    monkeypatch.setattr(Store, "open_table", counted)
    cut = read_as_of(lake, "pipe", 2500)
    outputs = Lake.at(lake).outputs("pipe")  # _errors too
    versions: dict[str, list[int | None]] = {str(Lake.at(lake).output_path("pipe", o)): [] for o in outputs}
    for path, version in opened:
        versions.get(path, []).append(version)
    assert versions == {path: [None] for path in versions}, versions  # each output once, at its newest
    assert [(r["user"], r["n"]) for r in cut["scores"].to_pylist()] == [(1, 2)]  # as of the second batch
    assert sorted(r["n"] for r in cut["clicks"].to_pylist()) == [1, 2]

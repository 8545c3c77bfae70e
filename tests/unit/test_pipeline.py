"""The batch loop on real Delta tables with the in-driver data plane (no Spark, no broker)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reclock import Frontier
from reclock.errors import DefiniteSourceError
from reclock.persist.asof import read_as_of, readable_upper
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from tests.waiting import PATIENCE_S, wait_until

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())]), "views": pa.schema([("page", pa.string())])}
STEPS = ["minted", "written", "committed:_errors", "committed:clicks", "committed:views", "resumed"]

# A script: per batch, records to append as (partition, output, count).
scripts = st.lists(
    st.lists(st.tuples(st.sampled_from([0, 1, "x"]), st.sampled_from(list(SCHEMAS)), st.integers(1, 7)), max_size=4),
    min_size=1,
    max_size=5,
)


def feed(source: MemorySource, appends, counter: list[int]) -> None:
    for partition, output, count in appends:
        for _ in range(count):
            counter[0] += 1
            row = {"user": counter[0]} if output == "clicks" else {"page": f"p{counter[0]}"}
            source.append(partition, output, [row])


def tables(lake, name: str = "pipe") -> dict[str, list[dict]]:
    lake = Lake.at(lake)
    out = {}
    for output in lake.outputs(name):
        table = read_table(DeltaTable(str(lake.output_path(name, output))))
        out[output] = sorted(table.to_pylist(), key=lambda r: (r["_partition"], r["_offset"]))
    return out


def run_script(lake, script, settings: Settings, crash: CrashAt | None = None) -> int:
    """Drive a pipeline one tick per script entry, then until finished.

    On a crash the driver restarts and only catches up what the crashed tick left pending, as a
    real restart does; the next tick then goes on as in an uninterrupted run.
    """
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    counter = [0]
    crashes = 0

    def start() -> Pipeline:
        return Pipeline("pipe", lake, source, settings=settings, now=clock, on_step=crash)

    pipeline = start()
    tick = 0
    while not pipeline.finished:
        if tick < len(script):
            feed(source, script[tick], counter)
        elif tick == len(script):
            source.finish()
        assert tick < len(script) + 100, "the pipeline never finished"
        tick += 1
        clock.ms = 1000 * tick
        try:
            pipeline.step()
        except SimulatedCrash:
            crashes += 1
            pipeline = start()
            while pipeline.pending:
                try:
                    pipeline.step()
                except SimulatedCrash:
                    crashes += 1
                    pipeline = start()
    return crashes


@settings(max_examples=30)
@given(script=scripts, step=st.sampled_from(STEPS), nth=st.integers(1, 4), max_batch=st.sampled_from([3, 1000]))
def test_crash_anywhere_then_restart_equals_an_uninterrupted_run(tmp_path_factory, script, step, nth, max_batch):
    knobs = Settings(max_batch=max_batch, idle_interval=3600)
    clean = tmp_path_factory.mktemp("clean")
    crashed = tmp_path_factory.mktemp("crashed")
    run_script(clean, script, knobs)
    assume(run_script(crashed, script, knobs, crash=CrashAt(step, nth)) > 0)
    expected = tables(clean)
    assert tables(crashed) == expected
    total = sum(count for appends in script for _, _, count in appends)
    assert sum(len(rows) for name, rows in expected.items() if name != "_errors") == total


def test_every_record_lands_exactly_once_with_its_binding_time(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock)
    source.append(0, "clicks", [{"user": 1}, {"user": 2}])
    pipeline.step()
    clock.ms = 2000
    source.append(0, "views", [{"page": "a"}])
    source.append(1, "clicks", [{"user": 3}])
    pipeline.step()
    got = tables(tmp_path)
    assert [(r["_offset"], r["_into_ts"]) for r in got["clicks"]] == [(0, 1000), (1, 1000), (0, 2000)]
    assert [(r["page"], r["_offset"], r["_into_ts"]) for r in got["views"]] == [("a", 2, 2000)]


def test_restart_resumes_from_the_slowest_output(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    source.append(0, "clicks", [{"user": 1}])
    source.append(0, "views", [{"page": "a"}])
    with pytest.raises(SimulatedCrash):
        Pipeline("pipe", tmp_path, source, now=clock, on_step=CrashAt("committed:clicks")).step()
    restarted = Pipeline("pipe", tmp_path, source, now=clock)
    assert restarted.resume_upper == 0  # views (and _errors) still hold nothing
    assert restarted.sinks["clicks"].upper == 1001
    report = restarted.step()
    assert report.rows == {"_errors": 0, "clicks": 0, "views": 1}
    assert len(tables(tmp_path)["clicks"]) == 1


def test_max_batch_bounds_each_binding_and_shares_it_fairly(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    source.append(0, "clicks", [{"user": i} for i in range(10)])
    source.append(1, "clicks", [{"user": i} for i in range(2)])
    pipeline = Pipeline("pipe", tmp_path, source, now=clock, settings=Settings(max_batch=6))
    report = pipeline.step()
    assert sum(report.rows.values()) == 6
    assert pipeline.remap.bindings.frontier == Frontier({0: 4, 1: 2})


def test_idle_source_advances_time_only_every_idle_interval(tmp_path):
    source = MemorySource(SCHEMAS)
    source.append(0, "clicks", [{"user": 1}])
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock, settings=Settings(idle_interval=5))
    pipeline.step()
    clock.ms = 3000
    assert pipeline.step().idle
    clock.ms = 6000
    assert not pipeline.step().idle
    assert readable_upper(tmp_path, "pipe") == 6001


def test_regressing_source_upper_is_a_definite_error(tmp_path):
    source = MemorySource(SCHEMAS)
    source.append(0, "clicks", [{"user": 1}, {"user": 2}])
    pipeline = Pipeline("pipe", tmp_path, source, now=FakeClock(1000))
    pipeline.step()
    source.hold(Frontier({0: 1}))
    with pytest.raises(DefiniteSourceError, match="went back below what is already bound: 0 is at 1 below bound 2"):
        pipeline.step()


def test_as_of_reads_are_consistent_cuts_across_outputs(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock)
    for i in range(1, 5):
        clock.ms = 1000 * i
        source.append(i % 2, "clicks", [{"user": i}])
        source.append(0, "views", [{"page": str(i)}] * i)
        pipeline.step()
    assert readable_upper(tmp_path, "pipe") == 4001
    final = tables(tmp_path)
    for as_of in (999, 1000, 1500, 2000, 3999, 4000):
        cut = read_as_of(tmp_path, "pipe", as_of)
        for output, rows in final.items():
            expected = sorted((r["_partition"], r["_offset"]) for r in rows if r["_into_ts"] <= as_of)
            got = sorted(zip(cut[output]["_partition"].to_pylist(), cut[output]["_offset"].to_pylist(), strict=True))
            assert got == expected
    with pytest.raises(ValueError, match="readable upper"):
        read_as_of(tmp_path, "pipe", 4001)


def test_bounded_source_closes_the_remap_and_finishes(tmp_path):
    source = MemorySource(SCHEMAS)
    source.append(0, "clicks", [{"user": 1}])
    source.finish()
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock)
    pipeline.run()
    assert pipeline.finished and pipeline.remap.bindings.is_closed
    assert len(tables(tmp_path)["clicks"]) == 1
    assert source.committed[-1] == Frontier.closed()


def test_an_output_added_later_is_backfilled_without_duplicating_the_others(tmp_path):
    clock = FakeClock(1000)
    first = MemorySource({"clicks": SCHEMAS["clicks"]})
    first.append(0, "clicks", [{"user": 1}, {"user": 2}])
    Pipeline("pipe", tmp_path, first, now=clock).step()
    clock.ms = 2000
    first.append(0, "clicks", [{"user": 3}])
    with pytest.raises(SimulatedCrash):  # binding 2000 is durable, clicks still holds only 1000
        Pipeline("pipe", tmp_path, first, now=clock, on_step=CrashAt("minted")).step()

    # The same stream, now also routing some records to a new output: records are immutable, so
    # the new source reads the very same offsets, with an output the lake has never seen.
    second = MemorySource(SCHEMAS)
    second.append(0, "clicks", [{"user": 1}, {"user": 2}, {"user": 3}])
    second.append(1, "views", [{"page": "old"}])
    clock.ms = 3000
    pipeline = Pipeline("pipe", tmp_path, second, now=clock)
    assert pipeline.resume_upper == 0 and pipeline.sinks["clicks"].upper == 1001
    while pipeline.pending:
        pipeline.step()
    got = tables(tmp_path)
    assert [(r["user"], r["_into_ts"]) for r in got["clicks"]] == [(1, 1000), (2, 1000), (3, 2000)]
    assert got["views"] == []  # its partition was never bound yet: it waits for the next binding
    pipeline.step()
    assert [r["page"] for r in tables(tmp_path)["views"]] == ["old"]


def test_a_second_driver_with_a_stale_plan_is_fenced_and_duplicates_nothing(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    source.append(0, "clicks", [{"user": 1}, {"user": 2}])
    a = Pipeline("pipe", tmp_path, source, now=clock)
    b = Pipeline("pipe", tmp_path, source, now=clock)  # its view of the outputs goes stale below
    a.step()
    clock.ms = 2000
    source.append(0, "clicks", [{"user": 3}])
    source.finish()
    b.run()  # plans from upper 0 at first, is fenced at commit, re-reads and goes on
    assert [(r["user"], r["_into_ts"]) for r in tables(tmp_path)["clicks"]] == [(1, 1000), (2, 1000), (3, 2000)]


def test_only_one_job_can_run_a_pipeline_at_a_time(tmp_path):
    from reclock.persist.lease import Lease, LeaseHeld

    lake = Lake.at(tmp_path)
    first = Lease.acquire(lake, "pipe")
    with pytest.raises(LeaseHeld, match="already running"):
        Lease.acquire(lake, "pipe")
    first.release()
    Lease.acquire(lake, "pipe").release()


def test_a_finished_pipeline_does_not_hold_back_reads_across_pipelines(tmp_path):
    done = MemorySource(SCHEMAS)
    done.append(0, "clicks", [{"user": 1}])
    done.finish()
    Pipeline("done", tmp_path, done, now=FakeClock(1000)).run()
    live = MemorySource(SCHEMAS)
    live.append(0, "views", [{"page": "a"}])
    clock = FakeClock(5000)
    Pipeline("live", tmp_path, live, now=clock).step()
    assert readable_upper(tmp_path, ["done", "live"]) == 5001
    assert read_as_of(tmp_path, "done", 5000)["clicks"].num_rows == 1


def test_as_of_reads_survive_delta_log_cleanup(tmp_path):
    source = MemorySource(SCHEMAS)
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock)
    for i in range(1, 4):
        clock.ms = 1000 * i
        source.append(0, "clicks", [{"user": i}])
        pipeline.step()
    log = Lake.at(tmp_path).output_path("pipe", "clicks") / "_delta_log"
    DeltaTable(str(log.parent)).create_checkpoint()
    for old in sorted(log.glob("0000000000000000000[01].json")):
        old.unlink()  # what log retention does to versions older than 30 days
    assert read_as_of(tmp_path, "pipe", 3000)["clicks"].num_rows == 3
    assert read_as_of(tmp_path, "pipe", 2000)["clicks"].num_rows == 2


def test_a_source_that_forgets_partitions_is_not_mistaken_for_a_recreated_one(tmp_path):
    source = MemorySource(SCHEMAS)
    source.forgets_partitions = True
    source.append(0, "clicks", [{"user": 1}])
    source.append(1, "clicks", [{"user": 2}])
    clock = FakeClock(1000)
    pipeline = Pipeline("pipe", tmp_path, source, now=clock)
    pipeline.step()
    source.hold(Frontier({1: 1}))  # partition 0 (a file, say) was deleted after it was loaded
    clock.ms = 20_000
    assert pipeline.step().binding_ts == 20_000  # time advances; nothing regresses, nothing fails


def test_splits_pack_into_balanced_tasks_and_none_is_lost():
    from reclock.runtime.planes import _pack
    from reclock.sources.base import Split

    splits = [Split(f"f{i}", 0, size) for i, size in enumerate([90, 10, 40, 40, 30, 30, 5, 5])]
    groups = _pack(splits, 4)
    assert len(groups) == 4 and sorted(s.partition for g in groups for s in g) == sorted(s.partition for s in splits)
    loads = sorted(sum(s.end - s.start for s in g) for g in groups)
    assert loads == [50, 50, 60, 90]  # largest first into the least loaded task
    assert _pack(splits[:2], 4) == [[splits[0]], [splits[1]]]


class UnansweredProbe(MemorySource):
    """A source whose probe does not answer until released (a broker that is down)."""

    def __init__(self) -> None:
        super().__init__(SCHEMAS)
        self.release = threading.Event()
        self.probing = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def upper(self) -> Frontier:
        with self._lock:
            self.probing += 1
            self.most_at_once = max(self.most_at_once, self.probing)
        self.release.wait(10 * PATIENCE_S)  # past the test's patience: only a release answers it
        with self._lock:
            self.probing -= 1
        return super().upper()


def test_a_stop_is_heard_while_a_probe_waits_and_the_next_run_takes_its_answer(tmp_path):
    source = UnansweredProbe()
    source.append(0, "clicks", [{"user": 1}])
    pipeline = Pipeline("pipe", tmp_path, source, now=FakeClock(1000))
    stop = threading.Event()
    run = threading.Thread(target=pipeline.run, args=(stop,), daemon=True)
    run.start()
    wait_until(lambda: source.probing, "the probe to be asked")
    stop.set()
    run.join(PATIENCE_S)
    assert not run.is_alive(), "the stop was not heard while the probe waits"
    assert pipeline.health is Health.STOPPED and len(pipeline.remap.bindings) == 0  # nothing was minted
    source.finish()
    threading.Timer(0.3, source.release.set).start()
    pipeline.run()  # waits for the probe given up above instead of starting a second one beside it
    assert pipeline.finished and source.most_at_once == 1
    assert [r["user"] for r in tables(tmp_path)["clicks"]] == [1]


class ClosingSource(MemorySource):
    closed = 0

    def close(self) -> None:
        self.closed += 1


def test_run_closes_the_source_once_however_it_ends(tmp_path):
    finished = ClosingSource(SCHEMAS)
    finished.append(0, "clicks", [{"user": 1}])
    finished.finish()
    Pipeline("done", tmp_path, finished, now=FakeClock(1000)).run()
    assert finished.closed == 1
    stopped = ClosingSource(SCHEMAS)
    stop = threading.Event()
    stop.set()
    Pipeline("stopped", tmp_path, stopped, now=FakeClock(1000)).run(stop)
    assert stopped.closed == 1
    broken = ClosingSource(SCHEMAS)
    broken.append(0, "clicks", [{"user": 1}])
    broken.hold(Frontier({0: 1}))
    pipeline = Pipeline("broken", tmp_path, broken, now=FakeClock(1000))
    pipeline.step()
    broken.hold(Frontier({0: 0}))  # goes back below what is bound: a definite failure
    with pytest.raises(DefiniteSourceError):
        pipeline.run()
    assert broken.closed == 1

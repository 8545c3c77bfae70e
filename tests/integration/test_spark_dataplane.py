"""The Spark data plane against the in-driver one, on the generator, with real Delta tables."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from reclock.persist.asof import CLOSED_UPPER, read_as_of, read_as_of_spark, readable_upper
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import KEEP_WARM_FOR_S, KEEP_WARM_GROUP, KEEP_WARM_S, LocalDataPlane, SparkDataPlane
from reclock.runtime.settings import Settings
from reclock.sources.generator import GeneratorSource
from reclock.testing import FakeClock
from tests.integration.helpers import assert_exactly_once_and_stamped_by_the_remap

PARTITIONS, LIMIT = 4, 60_000


def drive(lake: Path, plane, source=None) -> Pipeline:
    source = source or GeneratorSource(partitions=PARTITIONS, limit=LIMIT, rate=20_000, max_split_offsets=7_000)
    clock = FakeClock(0)
    pipeline = Pipeline("gen", lake, source, data_plane=plane, now=clock, settings=Settings(max_batch=25_000))
    while not pipeline.finished:
        clock.advance(1_000)
        pipeline.step()
    return pipeline


def full_rows(lake: Path) -> dict[str, list[dict]]:
    lake = Lake.at(lake)
    return {
        output: sorted(
            read_table(DeltaTable(str(lake.output_path("gen", output)))).to_pylist(),
            key=lambda r: (r["_partition"], r["_offset"]),
        )
        for output in lake.outputs("gen")
    }


def test_spark_and_in_driver_planes_land_identical_rows(spark, tmp_path):
    drive(tmp_path / "spark", SparkDataPlane(spark))
    drive(tmp_path / "local", LocalDataPlane())
    assert full_rows(tmp_path / "spark") == full_rows(tmp_path / "local")
    assert_exactly_once_and_stamped_by_the_remap(tmp_path / "spark", "gen", PARTITIONS, LIMIT)


def test_spark_as_of_read_matches_the_arrow_as_of_read(spark, tmp_path):
    pipeline = drive(tmp_path, SparkDataPlane(spark))
    times = [t for t, _ in pipeline.remap.bindings]
    assert readable_upper(tmp_path, "gen") == CLOSED_UPPER  # finished: it holds no reader back
    for as_of in (times[0], times[len(times) // 2] - 1, times[-1], times[-1] + 10**6):
        arrow = {name: t.num_rows for name, t in read_as_of(tmp_path, "gen", as_of).items()}
        frames = {name: df.count() for name, df in read_as_of_spark(spark, tmp_path, "gen", as_of).items()}
        assert frames == arrow
    assert sum(n for name, n in arrow.items() if name != "_errors") == LIMIT


class FailsOnceSource(GeneratorSource):
    """Fails the first read of one split, in whichever executor process runs it (a marker file)."""

    def __init__(self, marker: str, **options) -> None:
        super().__init__(**options)
        self.marker = marker

    def read(self, split):
        if split.start > 0 and not Path(self.marker).exists():
            Path(self.marker).touch()
            yield from list(super().read(split))[:1]  # some rows were produced, then the task dies
            raise OSError("simulated executor fault")
        yield from super().read(split)


def test_a_failed_batch_is_retried_whole_and_lands_once(spark, tmp_path):
    source = FailsOnceSource(
        str(tmp_path / "failed-once"), partitions=PARTITIONS, limit=LIMIT, rate=20_000, max_split_offsets=7_000
    )
    clock = FakeClock(0)
    pipeline = Pipeline(
        "gen",
        tmp_path / "lake",
        source,
        data_plane=SparkDataPlane(spark),
        now=clock,
        settings=Settings(max_batch=25_000),
    )
    failures = 0
    while not pipeline.finished:
        clock.advance(1_000)
        try:
            pipeline.step()
        except Exception as exc:
            assert "simulated executor fault" in str(exc)
            failures += 1
    assert failures == 1 and (tmp_path / "failed-once").exists()
    assert_exactly_once_and_stamped_by_the_remap(tmp_path / "lake", "gen", PARTITIONS, LIMIT)


def test_a_spark_worker_leaves_what_it_holds_out_of_the_collections_after_its_tasks(spark):
    import gc

    frozen = SparkDataPlane(spark).map(lambda _: gc.get_freeze_count(), list(range(4)))
    assert len(frozen) == 4 and min(frozen) > 1_000, frozen  # a worker holds tens of thousands of objects


def test_a_spark_worker_allocates_arrow_memory_with_malloc(spark):
    import pyarrow as pa

    pools = SparkDataPlane(spark).map(lambda _: pa.default_memory_pool().backend_name, [0, 1])
    assert pools == ["system", "system"], pools


def test_a_spark_worker_talks_to_its_jvm_over_a_unix_socket(spark):
    """The worker's link to its JVM is the socket its daemon (the worker's parent) accepted on its
    listening socket, so the daemon's sockets say which transport it is. The worker's own sockets
    do not: a reused worker also holds what earlier tasks left open (an S3 client's connections)."""

    def daemon_sockets(_: object) -> tuple[list[str], list[str]]:  # defined here: pickled by value
        import os

        daemon = f"/proc/{os.getppid()}/fd"
        held = set()
        for fd in os.listdir(daemon):
            try:
                link = os.readlink(f"{daemon}/{fd}")
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                held.add(link[len("socket:[") : -1])

        def inodes(table: str, column: int) -> set[str]:
            with open(f"/proc/net/{table}") as f:
                next(f)  # the header
                return {line.split()[column] for line in f}

        return sorted(held & inodes("unix", 6)), sorted(held & (inodes("tcp", 9) | inodes("tcp6", 9)))

    for unix, tcp in SparkDataPlane(spark).map(daemon_sockets, [0, 1]):
        assert unix and not tcp, (unix, tcp)  # TCP on the loopback: 40-45 ms more a job


def test_an_idle_spark_plane_keeps_its_python_workers_with_one_empty_job(spark):
    now = [1_000.0]
    plane = SparkDataPlane(spark, clock=lambda: now[0])
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(KEEP_WARM_GROUP))
    assert not plane.keep_warm()  # it ran nothing yet: no workers of its own to keep
    plane.map(abs, [1, -2])
    now[0] += KEEP_WARM_S - 1
    assert not plane.keep_warm()  # not idle long enough
    now[0] += 2
    assert plane.keep_warm()
    now[0] += KEEP_WARM_S - 1
    assert not plane.keep_warm()  # counted from the last keep-warm job
    now[0] += 2
    assert plane.keep_warm()
    now[0] += KEEP_WARM_FOR_S
    assert not plane.keep_warm()  # long after its last work: the workers may go, as Spark lets them
    jobs = set(tracker.getJobIdsForGroup(KEEP_WARM_GROUP)) - before
    assert len(jobs) == 2 and all(tracker.getJobInfo(j).status == "SUCCEEDED" for j in jobs)


def test_spark_keeps_the_workers_of_a_plane_kept_warm_past_its_idle_minute(spark, long_lane):
    """Spark's own timing (a minute, checked every 10 s) sets this test's length: --long only."""
    if not long_lane:
        pytest.skip("waits 80 s for Spark's idle-worker timeout: scripts/test --long")
    import os

    plane = SparkDataPlane(spark)
    workers = set(plane.map(lambda _: os.getpid(), [0, 1]))
    deadline = time.monotonic() + 80
    while time.monotonic() < deadline:
        plane.keep_warm()
        time.sleep(5)
    assert set(plane.map(lambda _: os.getpid(), [0, 1])) <= workers  # the same processes, not new ones

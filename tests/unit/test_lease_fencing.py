"""A driver that lost its lease writes nothing twice: it stops at its next check, and where no check
can help (paused between the check and the commit) the output labels refuse what it brings."""

from __future__ import annotations

import json
import time
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reclock.job.status import Status, StatusWriter
from reclock.persist.lake import Lake
from reclock.persist.lease import Lease, LeaseLost
from reclock.persist.read import read_table
from reclock.persist.status_tables import StatusTables, read_status_table
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.testing import FakeClock, MemorySource
from reclock.timeline.frontier import wall_clock_ms

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())]), "views": pa.schema([("page", pa.string())])}


def fill(source: MemorySource, start: int, count: int) -> None:
    for i in range(start, start + count):
        source.append(i % 3, "clicks", [{"user": i}])
        source.append(i % 2, "views", [{"page": f"p{i}"}])


def rows(lake: Lake) -> dict[str, Counter]:
    out = {}
    for output in ("clicks", "views"):
        table = read_table(DeltaTable(str(lake.output_path("pipe", output))))
        keys = zip(table.column("_partition").to_pylist(), table.column("_offset").to_pylist(), strict=True)
        out[output] = Counter(keys)
    return out


def versions(lake: Lake) -> dict[str, int]:
    return {o: DeltaTable(str(lake.output_path("pipe", o))).version() for o in lake.outputs("pipe")}


def test_a_driver_paused_between_its_check_and_its_commit_is_refused_by_the_labels(tmp_path):
    """The window no lease closes: the stale driver's check passed, then it slept while another
    driver ran the pipeline to its end. Its commits land on outputs that moved past its batch."""
    lake = Lake.at(tmp_path)
    source = MemorySource(SCHEMAS)
    fill(source, 0, 20)
    clock = FakeClock(1000)
    successor: list[Pipeline] = []

    def sleep_through_a_takeover(step: str) -> None:
        if step == "written" and not successor:
            # Another driver, with the same source, runs everything while this one is paused.
            fill(source, 20, 10)
            source.finish()
            clock.advance(1000)
            successor.append(Pipeline("pipe", lake, source, now=clock))
            successor[0].run()

    stale = Pipeline("pipe", lake, source, now=clock, on_step=sleep_through_a_takeover)
    stale.run()  # resumes after the pause: every commit it brings is already in, or fenced
    assert successor[0].finished and stale.finished
    for output, seen in rows(lake).items():
        assert not [k for k, n in seen.items() if n > 1], f"{output}: a stale driver duplicated rows"
        assert sum(seen.values()) == 30, output


def test_a_driver_that_lost_its_lease_fails_before_its_next_commit_and_writes_nothing(tmp_path):
    lake = Lake.at(tmp_path)
    source = MemorySource(SCHEMAS)
    fill(source, 0, 10)
    clock = FakeClock(1000)
    lease = Lease.acquire(lake, "pipe", 1)  # not renewed in the background: as in a paused process
    seen_versions: list[dict[str, int]] = []

    def paused(step: str) -> None:
        if step == "written" and not seen_versions:
            time.sleep(1.3)  # paused past the ttl
            taker = Lease.acquire(lake, "pipe", 1)  # another driver takes over after the expiry
            successor = Pipeline("pipe", lake, source, now=clock, fence=taker.check)
            successor.step()
            seen_versions.append(versions(lake))

    stale = Pipeline("pipe", lake, source, now=clock, on_step=paused, fence=lease.check)
    with pytest.raises(LeaseLost, match="lost its lease"):
        stale.run()
    assert stale.health is Health.FAILED and "LeaseLost" in stale.last_error
    assert versions(lake) == seen_versions[0], "the driver that lost its lease committed after the takeover"
    assert all(n == 1 for seen in rows(lake).values() for n in seen.values())
    assert sum(rows(lake)["clicks"].values()) == 10


def test_a_driver_that_lost_its_lease_does_not_maintain_the_tables(tmp_path):
    """Its vacuum could delete files the new driver wrote and has not committed yet."""
    from reclock.runtime.settings import Maintenance

    lake = Lake.at(tmp_path)
    source = MemorySource(SCHEMAS)
    fill(source, 0, 10)
    lost: list[dict[str, int]] = []

    def fence() -> None:
        if lost:
            raise LeaseLost("pipeline 'pipe': this driver lost its lease")

    def after_commits(step: str) -> None:
        if step == "resumed":
            lost.append(versions(lake))  # taken over between the batch and its maintenance

    pipeline = Pipeline(
        "pipe", lake, source, now=FakeClock(1000), on_step=after_commits, fence=fence, maintenance=Maintenance(every=1)
    )
    with pytest.raises(LeaseLost):
        pipeline.run()
    assert pipeline.health is Health.FAILED
    assert versions(lake) == lost[0], "maintenance committed after the lease was lost"


def test_a_driver_paused_between_its_lease_check_and_its_status_write_does_not_overwrite_the_new_snapshot(tmp_path):
    """The status snapshot is fenced like data: the old driver's check still passes (it renewed a
    moment ago by its own clock), but the new driver took over and wrote its snapshot, so the
    old one's conditional write fails, its lease proves lost, and the snapshot stays the new one's."""
    lake = Lake.at(tmp_path)
    old = Lease.acquire(lake, "pipe", 5)
    stale = StatusWriter(lake, "pipe", old)
    stale.write(Status(pipeline="pipe", health="running", pid=1))
    new = Lease.acquire(lake, "pipe", 5, now=lambda: wall_clock_ms() + 5_100)  # its clock: the lease expired
    StatusWriter(lake, "pipe", new).write(Status(pipeline="pipe", health="starting", pid=2))
    old.check()  # the window no check closes: it passes
    with pytest.raises(LeaseLost):
        stale.write(Status(pipeline="pipe", health="running", pid=1, batches=7))
    assert json.loads(lake.status_path("pipe").read_text())["pid"] == 2
    with pytest.raises(LeaseLost):
        stale.write(Status(pipeline="pipe", health="failed", pid=1))
    assert json.loads(lake.status_path("pipe").read_text())["pid"] == 2


def test_a_status_snapshot_written_by_someone_else_is_written_over_while_the_lease_is_ours(tmp_path):
    lake = Lake.at(tmp_path)
    lease = Lease.acquire(lake, "pipe", 30)
    writer = StatusWriter(lake, "pipe", lease)
    writer.write(Status(pipeline="pipe", health="running", pid=1))
    lake.status_path("pipe").write_text("{}")  # by hand, or our own write whose answer was lost
    writer.write(Status(pipeline="pipe", health="running", pid=1, batches=2))
    assert json.loads(lake.status_path("pipe").read_text())["batches"] == 2
    lease.release()


def test_a_driver_that_lost_its_lease_flushes_none_of_its_buffered_status_rows(tmp_path):
    """Rows buffered before the takeover (an ``In Progress`` batch) are the old driver's last words:
    flushed after the takeover they would stand in the new driver's history for ever."""
    lake = Lake.at(tmp_path)
    old = Lease.acquire(lake, "pipe", 5)
    tables = StatusTables(lake, flush_interval=3600, fence=old.check)
    tables.append("batches", [{"pipeline": "pipe", "batch_id": 1, "state": "Succeeded"}])
    tables.flush()
    tables.append("batches", [{"pipeline": "pipe", "batch_id": 2, "state": "In Progress"}])
    tables.append("offsets", [{"pipeline": "pipe", "partition": "p", "latest": 9}])
    Lease.acquire(lake, "pipe", 5, now=lambda: wall_clock_ms() + 5_100)
    with pytest.raises(LeaseLost):
        old.renew()  # the old driver finds out (its renewer, a check)
    tables.append("errors", [{"pipeline": "pipe", "kind": "late"}])
    tables.close()
    batches = read_status_table(lake, "batches", "pipe")
    assert batches.column("batch_id").to_pylist() == [1]
    assert not lake.store.is_table(lake.status_table_path("offsets"))
    assert not lake.store.is_table(lake.status_table_path("errors"))

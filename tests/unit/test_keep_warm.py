"""A running pipeline gives its data plane the chance to keep its workers (``keep_warm``) while
it waits between batches and after batches that ran elsewhere: Spark stops an executor's idle
Python workers after a minute, and the next batch on Spark paid half a second for new ones."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from reclock.runtime import loop as pipeline_module
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Settings
from reclock.testing import FakeClock, MemorySource

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())])}


class CountingPlane(LocalDataPlane):
    """The driver's plane, counting when the pipeline offered it to keep warm."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[float] = []

    def keep_warm(self) -> bool:
        self.offered.append(time.monotonic())
        return False


def test_a_pipeline_waiting_between_batches_offers_its_plane_to_keep_warm_at_every_slice(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_module, "WARM_POLL_S", 0.05)
    plane = CountingPlane()
    idle = MemorySource(SCHEMAS)  # nothing to read: every step is idle, then a 30 s wait
    pipeline = Pipeline(
        "idle", tmp_path, idle, data_plane=plane, now=FakeClock(1000), settings=Settings(batch_interval=30)
    )
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    pipeline.run(stop)
    assert time.monotonic() - started < 5  # the stop is heard inside the wait
    assert len(plane.offered) >= 10, plane.offered  # about 20 slices of 0.05 s in the second
    gaps = [b - a for a, b in zip(plane.offered, plane.offered[1:], strict=False)]
    assert max(gaps) < 0.5, gaps


def test_a_pipeline_offers_its_plane_to_keep_warm_after_a_batch_too(tmp_path):
    plane = CountingPlane()
    busy = MemorySource(SCHEMAS)
    busy.append(0, "clicks", [{"user": 1}])
    busy.finish()
    Pipeline("busy", tmp_path, busy, data_plane=plane, now=FakeClock(1000)).run()
    assert plane.offered  # a batch in the driver leaves Spark idle as much as a wait does

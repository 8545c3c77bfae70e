"""A running pipeline gives its data plane the chance to keep its workers (``keep_warm``) while
it waits between batches and after batches that ran elsewhere: Spark stops an executor's idle
Python workers after a minute, and the next batch on Spark paid half a second for new ones."""

from __future__ import annotations

import threading

import pyarrow as pa

from reclock.runtime import loop as pipeline_module
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Settings
from reclock.testing import FakeClock, MemorySource
from tests.waiting import PATIENCE_S, wait_until

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())])}


class CountingPlane(LocalDataPlane):
    """The driver's plane, counting when the pipeline offered it to keep warm."""

    def __init__(self) -> None:
        super().__init__()
        self.offered = 0

    def keep_warm(self) -> bool:
        self.offered += 1
        return False


def test_a_pipeline_waiting_between_batches_offers_its_plane_to_keep_warm_at_every_slice(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_module, "WARM_POLL_S", 0.05)
    plane = CountingPlane()
    idle = MemorySource(SCHEMAS)  # nothing to read: every step is idle, then a wait past the test's patience
    pipeline = Pipeline(
        "idle",
        tmp_path,
        idle,
        data_plane=plane,
        now=FakeClock(1000),
        settings=Settings(batch_interval=10 * PATIENCE_S),
    )
    stop = threading.Event()
    run = threading.Thread(target=pipeline.run, args=(stop,), daemon=True)
    run.start()
    # Ten offers inside one wait that outlasts the patience: they come at every slice of it, not
    # once a wait (the count is of offers, whatever the time they take on a loaded machine).
    wait_until(lambda: plane.offered >= 10, "ten offers to keep warm")
    stop.set()
    run.join(PATIENCE_S)
    assert not run.is_alive(), "the stop was not heard inside the wait"


def test_a_pipeline_offers_its_plane_to_keep_warm_after_a_batch_too(tmp_path):
    plane = CountingPlane()
    busy = MemorySource(SCHEMAS)
    busy.append(0, "clicks", [{"user": 1}])
    busy.finish()
    Pipeline("busy", tmp_path, busy, data_plane=plane, now=FakeClock(1000)).run()
    assert plane.offered  # a batch in the driver leaves Spark idle as much as a wait does

"""A stop asked of a job is never lost, and never taken by a job that starts later
(:mod:`reclock.job.control`).

A job takes its pipeline's lease, and so counts as running for ``reclock stop``, before its
source and data plane have started (seconds, for a Spark session). It used to clear every stop
marker only after that, so a stop asked in between was dropped and the job ran on: the crash
campaign's last run, stopped at once after its start, hung there until its timeout. The marker
now names the job it is for by its lease's token.
"""

from __future__ import annotations

import threading

import pytest

from reclock.job import lifecycle
from reclock.job.control import request_stop
from reclock.job.status import job_alive, read_status
from reclock.persist.lake import Lake
from tests.cli import reclock_in_process
from tests.waiting import PATIENCE_S, wait_until

ENDLESS = """
[pipeline]
name = "orders"
lake = "{lake}"
engine = "local"
batch_interval = 0.1

[source]
kind = "generator"
partitions = 2
rate = 500
"""


@pytest.fixture
def lake(tmp_path) -> Lake:
    path = tmp_path / "orders.toml"
    path.write_text(ENDLESS.format(lake=tmp_path / "lake"))
    assert reclock_in_process("create", str(path)).returncode == 0
    return Lake.at(str(tmp_path / "lake"))


def _run(lake: Lake, seconds: float) -> threading.Thread:
    job = threading.Thread(target=lifecycle.run, args=(lake, "orders"), kwargs={"max_seconds": seconds}, daemon=True)
    job.start()
    return job


def test_a_stop_asked_while_the_job_starts_stops_it(lake, monkeypatch):
    reached, go = threading.Event(), threading.Event()
    real = lifecycle.data_plane

    def held(*args, **kwargs):  # the job holds the lease here, its data plane not yet started
        reached.set()
        assert go.wait(PATIENCE_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "data_plane", held)
    job = _run(lake, 10 * PATIENCE_S)  # far past the join below: only the stop ends it in time
    assert reached.wait(PATIENCE_S)
    assert job_alive(lake, "orders")  # so `reclock stop` asks, rather than saying it is not running
    asked = reclock_in_process("--lake", str(lake.root), "stop", "orders")
    assert asked.returncode == 0 and "asked pipeline 'orders' to stop" in asked.stdout, asked
    go.set()
    job.join(PATIENCE_S)
    assert not job.is_alive(), "the stop asked while the job was starting was lost: it runs on"
    assert read_status(lake, "orders")["health"] == "stopped"


def test_a_stop_asked_of_an_earlier_job_does_not_stop_the_next_one(lake):
    first = _run(lake, 10 * PATIENCE_S)
    wait_until(lambda: (read_status(lake, "orders") or {}).get("health") == "running", "the first job to run")
    request_stop(lake, "orders")
    first.join(PATIENCE_S)
    assert not first.is_alive()
    before = read_status(lake, "orders")["batches"]
    request_stop(lake, "orders")  # asked of a job that has ended: its lease's token, not the next job's
    second = _run(lake, 10 * PATIENCE_S)
    # The second job runs on past the stale stop: it lands batch after batch, counted in its own
    # status, however long the machine takes over them.
    wait_until(lambda: read_status(lake, "orders")["batches"] - before >= 5, "the second job to land 5 batches")
    assert second.is_alive() and read_status(lake, "orders")["health"] == "running"
    request_stop(lake, "orders")  # a stop asked of this job does stop it
    second.join(PATIENCE_S)
    assert not second.is_alive() and read_status(lake, "orders")["health"] == "stopped"

"""Real job processes: executors in separate JVMs, and a SIGKILL in the middle of a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import zygote
from tests.cli import reclock_in_process
from tests.integration.helpers import assert_exactly_once_and_stamped_by_the_remap, reclock_cli, write_config
from tests.waiting import PATIENCE_S

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("reclock_processes")]  # Spark jobs, in subprocesses


def test_executors_in_separate_processes_run_the_data_plane(tmp_path):
    """local-cluster mode pickles every split, the source and the stamper into other JVMs' workers."""
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "cluster", "lake": "lake", "engine": "spark", "max_batch": 15_000},
        spark={
            "master": "local-cluster[2,1,1024]",
            "conf": {"spark.executor.memory": "768m"},
            "background_start": False,  # every batch on the executors, none in the driver
        },
        source={"kind": "generator", "partitions": 4, "limit": 40_000, "max_split_offsets": 4_000},
    )
    assert reclock_in_process("create", str(config)).returncode == 0
    done = reclock_cli("--lake", str(tmp_path / "lake"), "start", "cluster", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_exactly_once_and_stamped_by_the_remap(tmp_path / "lake", "cluster", 4, 40_000)


def test_sigkill_mid_run_then_restart_loses_and_duplicates_nothing(tmp_path):
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "killed", "lake": "lake", "engine": "spark", "max_batch": 10_000, "batch_interval": 0.2},
        source={"kind": "generator", "partitions": 4, "rate": 25_000, "limit": 150_000},
    )
    assert reclock_in_process("create", str(config)).returncode == 0
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    job = zygote.popen(
        ["--lake", str(lake), "start", "killed"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    status_path = lake / "killed" / "status.json"
    deadline = time.monotonic() + 180
    status = {}
    while time.monotonic() < deadline and status.get("batches", 0) < 3:
        time.sleep(0.1)
        if status_path.exists():
            status = json.loads(status_path.read_text())
    assert status.get("batches", 0) >= 3, "the job never got going"
    os.killpg(job.pid, signal.SIGKILL)  # the driver and its Spark JVM, mid-run
    job.wait(timeout=PATIENCE_S)
    assert not status.get("finished")

    done = reclock_cli("--lake", str(lake), "start", "killed", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(status_path.read_text())["finished"]
    assert_exactly_once_and_stamped_by_the_remap(lake, "killed", 4, 150_000)

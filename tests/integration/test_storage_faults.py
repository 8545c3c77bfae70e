"""A lake that fills up or turns read-only stalls the job; when the fault clears, ingestion goes on.

The lake lives on a small tmpfs of its own (so these tests need root, which CI and the developers'
machines have; elsewhere they skip with that reason). A real ``reclock start`` process ingests a
files pipeline while the test keeps dropping files it recorded; mid-run the test fills the tmpfs,
or remounts it read-only, for long enough that every kind of write fails (data files, output
commits, remap bindings, status tables, the status file). The job must stay alive, say ``stalled``
with the reason, never skip or half-commit a batch (``stop_on_error = false`` and one retry would
skip a batch the moment a storage fault counted as bad data), and land every row exactly once
after the fault clears, as the test's own Delta log reader sees it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, label_of, read_rows
from tests.integration.helpers import files_pipeline_config
from tests.waiting import PATIENCE_S

pytestmark = [
    pytest.mark.usefixtures("reclock_processes"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs for the lake: needs root"),
]

ROWS_PER_FILE = 200


@pytest.fixture
def small_lake(tmp_path: Path) -> Iterator[Path]:
    """A 24 MB tmpfs mounted for this test only, unmounted (lazily, whatever holds it) afterwards."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=False)
        subprocess.run(["umount", "-l", str(mount)], check=False)


class Dropper(threading.Thread):
    """Writes numbered CSV files into the source folder, one every ``interval`` seconds: the ground truth."""

    def __init__(self, folder: Path, interval: float) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.interval = interval
        self.ids: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.wait(self.interval):
            ids = range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE)
            tmp = self.folder / f".f{n:05d}.tmp"
            tmp.write_text("id,name\n" + "".join(f"{i},name-{i}\n" for i in ids))
            tmp.rename(self.folder / f"f{n:05d}.csv")  # appear whole
            self.ids += ids
            n += 1


def _reclock(lake: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return zygote.run(
        ["--lake", str(lake), *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def _status(lake: Path) -> dict:
    done = reclock_in_process("--lake", str(lake), "status", "ingest", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]


def _wait(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting until {what}")


def _start(tmp_path: Path, lake: Path) -> tuple[subprocess.Popen, Path]:
    source = tmp_path / "in"
    source.mkdir()
    knobs = {"lake": str(lake), "batch_interval": 0.1, "max_retries": 1, "retry_backoff": 0.2, "max_backoff": 1.0}
    config = files_pipeline_config(
        tmp_path / "files.toml",
        source,
        pipeline={**knobs, "stop_on_error": False},
        source={"max_files_per_batch": 3},
    )
    created = reclock_in_process("--lake", str(lake), "create", str(config))
    assert created.returncode == 0, created.stderr
    log = tmp_path / "job.log"
    job = zygote.popen(
        ["--lake", str(lake), "start", "ingest"],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )
    return job, source


def _fill(mount: Path) -> Path:
    """Write until the tmpfs refuses another byte."""
    filler = mount / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def _output_rows(lake: Path) -> Counter:
    table = read_rows(DeltaLog(lake / "ingest" / "outputs" / "rows").refresh(), ["id"])
    return Counter(table.column("id").to_pylist()) if table is not None else Counter()


def _check_exactly_once(lake: Path, ids: list[int]) -> None:
    got = _output_rows(lake)
    assert not [i for i, n in got.items() if n > 1], "duplicated rows"
    assert set(got) == set(ids), f"missing {len(set(ids) - set(got))}, unexpected {len(set(got) - set(ids))}"
    errors = read_rows(DeltaLog(lake / "ingest" / "outputs" / "_errors").refresh())
    assert errors is None or errors.num_rows == 0, errors.to_pylist()[:3]  # a full disk is not bad data
    assert label_of(DeltaLog(lake / "ingest" / "outputs" / "rows").refresh(), "reclock/ingest/rows") is not None


def _run_through_a_fault(tmp_path: Path, mount: Path, inject, clear, reason: str) -> None:
    lake = mount / "lake"
    job, source = _start(tmp_path, lake)
    dropper = Dropper(source, interval=0.15)
    dropper.start()
    try:
        _wait("the first rows land", lambda: sum(_output_rows(lake).values()) > 0, 60)
        undo = inject()
        _wait(
            f"the job logs a stall naming the fault ({reason})",
            lambda: reason in (tmp_path / "job.log").read_text(),
            PATIENCE_S,
        )
        time.sleep(3)  # several failed attempts of every kind of write
        assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        _wait("reclock status says stalled", lambda: _status(lake)["health"] == "stalled", PATIENCE_S)
        stalled = _status(lake)
        assert "lake" in stalled["last_error"], stalled
        clear(undo)
        _wait("the job runs again", lambda: _status(lake)["health"] == "running", 60)
        dropper.halt.set()
        dropper.join()
        _wait("every dropped row lands", lambda: set(_output_rows(lake)) >= set(dropper.ids), 120)
        assert job.poll() is None
    finally:
        dropper.halt.set()
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            job.wait(60)
    assert job.returncode == 0, (tmp_path / "job.log").read_text()[-3000:]
    log = (tmp_path / "job.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert _status(lake)["health"] == "stopped"
    _check_exactly_once(lake, dropper.ids)


def test_a_full_lake_stalls_the_job_and_it_lands_everything_once_when_space_returns(tmp_path, small_lake):
    _run_through_a_fault(
        tmp_path,
        small_lake,
        inject=lambda: _fill(small_lake),
        clear=lambda filler: filler.unlink(),
        reason="No space left on device",
    )


def test_a_read_only_lake_stalls_the_job_and_it_lands_everything_once_when_writable_again(tmp_path, small_lake):
    def remount(mode: str) -> None:
        """Remount; going read-only waits for a moment when no file is open for writing."""
        for _ in range(200):
            if subprocess.run(["mount", "-o", f"remount,{mode}", str(small_lake)], capture_output=True).returncode == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"could not remount the lake {mode}")

    _run_through_a_fault(
        tmp_path,
        small_lake,
        inject=lambda: remount("ro"),
        clear=lambda _: remount("rw"),
        reason="Read-only file system",
    )


def test_a_status_left_by_a_killed_job_reads_dead_not_running(tmp_path, small_lake):
    lake = small_lake / "lake"
    job, source = _start(tmp_path, lake)
    (source / "a.csv").write_text("id,name\n1,a\n")
    try:
        _wait("the job runs", lambda: _status(lake)["health"] == "running", 60)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(PATIENCE_S)
    raw = json.loads((lake / "ingest" / "status.json").read_text())
    assert raw["health"] == "running"  # the file still claims it ...
    status = _status(lake)
    assert status["health"] == "dead"  # ... the reader does not believe it
    assert f"pid {job.pid}" in status["last_error"]


def test_starting_on_a_read_only_lake_is_one_line_not_a_traceback(tmp_path, small_lake):
    lake = small_lake / "lake"
    job, _ = _start(tmp_path, lake)
    job.send_signal(signal.SIGTERM)
    job.wait(60)
    subprocess.run(["mount", "-o", "remount,ro", str(small_lake)], check=True)
    started = _reclock(lake, "start", "ingest", "--max-seconds", f"{PATIENCE_S:.0f}")  # it fails, and ends
    assert started.returncode == 1
    assert "Traceback" not in started.stderr
    assert len(started.stderr.strip().splitlines()) == 1, started.stderr
    assert "Read-only file system" in started.stderr

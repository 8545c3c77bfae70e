"""Work a source's probe asks the runtime to run outside batches (:class:`~reclock.sources.base.RunFirst`):
where it runs, in which order its results come back, and what a task's copy of the source carries;
and the Postgres source's state folder on a local disk (S3: tests/integration/postgres_source)."""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa

from reclock.runtime.planes import LocalDataPlane, run_in_order, task_runner
from reclock.sources.base import AsksFirst
from reclock.sources.postgres.source import PostgresSource
from reclock.sources.state import StateFolder


def _square_and_thread(n: int) -> tuple[int, str]:
    return n * n, threading.current_thread().name


def test_the_driver_plane_maps_in_its_threads_in_order():
    results = task_runner(LocalDataPlane(threads=3))(_square_and_thread, list(range(20)))
    assert [r for r, _ in results] == [n * n for n in range(20)]
    assert all(name.startswith("reclock-task") for _, name in results)


def test_a_plane_without_map_runs_the_work_here():
    class Plain:
        def run(self, plan, splits):
            return []

    assert task_runner(Plain()) is run_in_order
    assert run_in_order(_square_and_thread, [3])[0][0] == 9


def test_the_postgres_source_asks_first_and_never_pickles_the_capture_it_holds_open():
    source = PostgresSource.__new__(PostgresSource)  # no server: only the pickling of a task's copy
    held = threading.Lock()  # stands for the capture's exporting connection: it cannot pickle
    source._waiting = held
    assert isinstance(source, AsksFirst)
    copy = pickle.loads(pickle.dumps(source))
    assert copy._waiting is None and source._waiting is held


def test_a_local_state_folder_writes_whole_files_and_clears(tmp_path):
    state = StateFolder.at(str(tmp_path / "state"))
    assert state.read_text("snapshot.json") is None and state.files("chunks") == []
    state.write_parquet("chunks/a.parquet", pa.table({"x": ["1", None]}))
    state.write_bytes("snapshot.json", b'{"k": 1}')
    assert state.read_text("snapshot.json") == '{"k": 1}'
    assert state.read_parquet("chunks/a.parquet").column("x").to_pylist() == ["1", None]
    assert state.files("chunks") == ["a.parquet"]  # no temporary file left beside it
    state.clear("chunks")
    assert state.files("chunks") == []
    assert pickle.loads(pickle.dumps(state)) == state


def test_a_state_folder_in_s3_keeps_its_options_out_of_sight():
    state = StateFolder.at("s3://bucket/lake/p/control/source", {"secret_access_key": "hunter2"})
    assert state.remote and state.root == "s3://bucket/lake/p/control/source"
    assert "hunter2" not in repr(state) and "hunter2" not in str(state)

"""Output sinks: labelled commits make a replay a no-op and keep races safe."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from reclock.persist.data_files import write_data_file
from reclock.persist.read import read_table
from reclock.persist.sink import OutputSink, table_schema

OWN = pa.schema([("x", pa.int64())])


def rows(xs, into_ts):
    schema = table_schema(OWN)
    return pa.table(
        {"x": xs, "_into_ts": [into_ts] * len(xs), "_partition": ["0"] * len(xs), "_offset": xs}, schema=schema
    )


def test_replayed_batch_leaves_the_delta_log_unchanged(tmp_path):
    sink = OutputSink(tmp_path / "t", "reclock/p/t", table_schema(OWN))
    assert sink.commit([write_data_file(str(sink.path), "t", rows([1, 2], 10))], 10)
    version = DeltaTable(str(sink.path)).version()
    replay = write_data_file(str(sink.path), "t", rows([1, 2], 10))
    assert not sink.commit([replay], 10)
    assert DeltaTable(str(sink.path)).version() == version
    assert read_table(DeltaTable(str(sink.path))).num_rows == 2
    assert not (sink.path / replay.path).exists()  # the replay's file does not linger as an orphan


def test_a_restarted_sink_reads_its_upper_from_the_label(tmp_path):
    sink = OutputSink(tmp_path / "t", "reclock/p/t", table_schema(OWN))
    assert sink.upper == 0
    sink.commit([], 41)
    assert OutputSink(tmp_path / "t", "reclock/p/t", table_schema(OWN)).upper == 42


def test_a_second_writer_with_a_stale_upper_cannot_commit_the_same_batch_twice(tmp_path):
    first = OutputSink(tmp_path / "t", "reclock/p/t", table_schema(OWN))
    second = OutputSink(tmp_path / "t", "reclock/p/t", table_schema(OWN))
    assert first.commit([write_data_file(str(first.path), "t", rows([1], 5))], 5)
    assert not second.commit([write_data_file(str(second.path), "t", rows([1], 5))], 5)
    assert second.upper == 6
    assert read_table(DeltaTable(str(first.path))).num_rows == 1


def test_commit_statistics_let_readers_skip_files_by_into_time(tmp_path):
    sink = OutputSink(tmp_path / "t", "reclock/p/t", table_schema(OWN))
    sink.commit([write_data_file(str(sink.path), "t", rows([1, 2, 3], 7))], 7)
    actions = pa.table(DeltaTable(str(sink.path)).get_add_actions(flatten=True))
    assert actions.column("num_records").to_pylist() == [3]
    assert actions.column("min._into_ts").to_pylist() == [7]
    assert actions.column("max.x").to_pylist() == [3]

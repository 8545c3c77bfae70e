"""The fault suite's independent reader agrees with Delta and the design, and its checks can fail.

:mod:`tests.faults.reader` re-implements the Delta log replay and the reclock rule so that the
crash campaign does not judge the product with the product's own code. These tests pin that the
re-implementation is right (against deltalake and against :class:`~reclock.timeline.bindings.Bindings`),
and that the campaign's checks flag a lost, duplicated, unexpected, altered or mis-stamped row.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.persist.remap import RemapTable
from reclock.timeline.frontier import encode_partition
from tests.faults.crash import Report, _check_appended, _check_stamps, parser
from tests.faults.reader import DeltaLog, Remap, checkpoint_agrees, label_of, read_rows
from tests.unit.strategies import binding_lists, partitions


def _append(path, ids, label=None):
    properties = CommitProperties(app_transactions=[Transaction("app", label)]) if label is not None else None
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64())}), mode="append", commit_properties=properties)


def test_live_files_labels_and_rows_match_deltalake_across_removes_and_a_checkpoint(tmp_path):
    path = tmp_path / "t"
    for i in range(4):
        _append(path, [i * 10, i * 10 + 1], label=i)
    DeltaTable(str(path)).delete("id < 11")  # rewrites and removes files
    DeltaTable(str(path)).create_checkpoint()
    _append(path, [99], label=7)
    log = DeltaLog(path).refresh()
    table = DeltaTable(str(path))
    assert sorted(log.uris()) == sorted(u.removeprefix("file://") for u in table.file_uris())
    assert log.version == table.version()
    assert label_of(log, "app") == 7 == table.transaction_version("app")
    assert sorted(read_rows(log)["id"].to_pylist()) == [11, 20, 21, 30, 31, 99]
    assert checkpoint_agrees(path) is True
    from_checkpoint = DeltaLog(path, from_checkpoint=True).refresh()
    assert set(from_checkpoint.files) == set(log.files) and label_of(from_checkpoint, "app") == 7


def test_refresh_reads_only_new_commits_and_a_missing_table_has_no_rows(tmp_path):
    log = DeltaLog(tmp_path / "t").refresh()
    assert log.version == -1 and read_rows(log) is None and label_of(log, "app") is None
    _append(tmp_path / "t", [1])
    assert read_rows(log.refresh())["id"].to_pylist() == [1]
    _append(tmp_path / "t", [2], label=3)
    assert sorted(read_rows(log.refresh())["id"].to_pylist()) == [1, 2] and label_of(log, "app") == 3


def test_an_interrupted_log_cleanup_reads_from_the_checkpoint_and_a_later_gap_still_fails(tmp_path):
    """Cleanup deletes commits below a checkpoint in any order; a SIGKILL can leave 0.json beside a
    hole. Readers start at the checkpoint then; a hole after it is a broken table."""
    path = tmp_path / "t"
    for i in range(4):
        _append(path, [i], label=i)
    DeltaTable(str(path)).create_checkpoint()
    _append(path, [9], label=9)
    log_dir = path / "_delta_log"
    (log_dir / f"{2:020d}.json").unlink()  # cleanup killed half way: 0.json is still there
    log = DeltaLog(path).refresh()
    assert sorted(read_rows(log)["id"].to_pylist()) == [0, 1, 2, 3, 9] and label_of(log, "app") == 9
    _append(path, [10], label=10)
    (log_dir / f"{4:020d}.json").unlink()  # a commit after the checkpoint lost: the table is broken
    with pytest.raises(AssertionError, match="the log has a gap"):
        DeltaLog(path).refresh()


def test_a_reader_left_behind_by_log_cleanup_catches_up_from_the_newer_checkpoint(tmp_path):
    path = tmp_path / "t"
    _append(path, [0], label=0)
    log = DeltaLog(path).refresh()  # a watcher that read version 0, then fell behind
    for i in range(1, 4):
        _append(path, [i], label=i)
    DeltaTable(str(path)).create_checkpoint()  # at version 3
    _append(path, [4], label=4)
    (path / "_delta_log" / f"{1:020d}.json").unlink()  # cleanup below the checkpoint
    assert sorted(read_rows(log.refresh())["id"].to_pylist()) == [0, 1, 2, 3, 4] and label_of(log, "app") == 4


@settings(max_examples=25, deadline=None)
@given(binding_lists(max_size=6), st.lists(st.tuples(partitions, st.integers(0, 40)), max_size=20))
def test_the_restated_reclock_rule_agrees_with_bindings_on_a_real_remap_table(tmp_path_factory, bindings, probes):
    remap = RemapTable(tmp_path_factory.mktemp("remap") / "remap")
    for time, frontier in bindings:
        assert remap.mint(time, frontier)
    ours = Remap.read(remap.path)
    for partition, offset in probes:
        assert ours.stamp(encode_partition(partition), offset) == remap.bindings.reclock(partition, offset)
    for time, _ in bindings:
        frontier = remap.bindings.source_upper_at(time + 1)  # R(time)
        if frontier.is_closed:
            assert ours.is_closed_at(time)
        else:
            assert ours.frontier_at(time) == {encode_partition(p): o for p, o in frontier.items()}


def test_the_checks_flag_lost_duplicated_unexpected_altered_and_misstamped_rows():
    expected = {("p", 0): {"id": 0}, ("p", 1): {"id": 1}, ("p", 2): {"id": 2}}
    rows = [
        {"_partition": "p", "_offset": 0, "id": 0, "_into_ts": 5},
        {"_partition": "p", "_offset": 0, "id": 0, "_into_ts": 5},  # twice
        {"_partition": "p", "_offset": 1, "id": 7, "_into_ts": 5},  # altered
        {"_partition": "p", "_offset": 9, "id": 9, "_into_ts": 6},  # never produced; offset 2 is lost
    ]
    report = Report()
    _check_appended(report, "out", rows, expected)
    _check_stamps(report, Remap([_binding(5, "p", 2), _binding(6, "p", 10)]), "out", rows)
    assert report.duplicated == ["out p@0 x2"] and report.lost == ["out p@2"] and report.unexpected == ["out p@9"]
    assert len(report.wrong_payload) == 1 and "p@1" in report.wrong_payload[0]
    assert report.wrong_into_ts == []
    _check_stamps(report, Remap([_binding(5, "p", 1), _binding(6, "p", 10)]), "out", rows)
    assert len(report.wrong_into_ts) == 1 and "p@1" in report.wrong_into_ts[0]  # offset 1 belongs to 6
    assert not report.clean()


def _binding(time: int, partition: str, offset: int) -> dict:
    return {"into_ts": time, "partition": partition, "offset": offset, "closed": False, "skip_start": None}


def test_the_long_mode_command_in_the_reliability_guide_parses():
    """docs/reliability.md quotes the long campaign's command; its flags must exist."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    (command,) = re.findall(r"^PYTHONPATH=.*-m tests\.faults\.crash(.*)$", guide, re.MULTILINE)
    args = parser().parse_args(shlex.split(command))
    assert args.kills >= 100 and args.spark_kills >= 1

"""Tasks read as one stream (a source's ``read_group``): same rows as split by split, per-split
counts still exact, and a failing task read again split by split so that exactly the failing
splits are reported (a pipeline that skips failed ranges must not skip the healthy ones)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from reclock.runtime.pipeline import BatchFailed, BatchState, Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Settings
from reclock.runtime.task import run_splits
from reclock.testing import FakeClock, MemorySource
from tests.unit.test_pipeline import tables

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())]), "views": pa.schema([("page", pa.string())])}


class GroupSource(MemorySource):
    """Reads a task's splits as one stream: one batch per output spanning every split."""

    def __init__(self, poison: frozenset = frozenset()) -> None:
        super().__init__(SCHEMAS, max_split_offsets=3)
        self.poison = poison
        self.group_reads = 0
        self.split_reads = 0

    def read(self, split):
        self.split_reads += 1
        if split.partition in self.poison:
            raise ValueError(f"corrupt record in {split.partition}")
        yield from super().read(split)

    def read_group(self, splits):
        self.group_reads += 1
        merged: dict[str, list[pa.RecordBatch]] = {}
        for split in splits:
            if split.partition in self.poison:
                raise ValueError(f"corrupt record in {split.partition}")
            for output, batch in super().read(split):
                merged.setdefault(output, []).append(batch)
        for output, batches in merged.items():
            yield output, pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class SplitBatches(GroupSource):
    """Reads a task's splits as one stream of one batch per split (as a snapshot's chunks are)."""

    def read_group(self, splits):
        self.group_reads += 1
        for split in splits:
            yield from MemorySource.read(self, split)


class PackedPlane(LocalDataPlane):
    """One task of every split, heaviest first as Spark's packing orders them (the later of two
    alike first): a partition's splits then come in no order of their offsets."""

    def run(self, plan, splits):
        return run_splits(plan, sorted(splits, key=lambda s: (s.end - s.start, s.start), reverse=True))


def _fill(source: MemorySource) -> dict[str, list]:
    source.append("a", "clicks", [{"user": i} for i in range(7)])  # cut into 3 splits of <= 3 offsets
    source.append("b", "views", [{"page": f"p{i}"} for i in range(2)])
    source.append("c", "clicks", [{"user": 100 + i} for i in range(4)])
    source.finish()
    return {"clicks": sorted([*range(7), *range(100, 104)]), "views": ["p0", "p1"]}


@pytest.mark.parametrize(
    ("kind", "plane"),
    [(GroupSource, LocalDataPlane), (GroupSource, PackedPlane), (SplitBatches, PackedPlane)],
    ids=["spanning batches", "spanning batches, splits packed", "a batch per split, splits packed"],
)
def test_a_group_read_lands_every_row_once_and_counts_them_per_split(tmp_path, kind, plane):
    source = kind()
    expected = _fill(source)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), data_plane=plane())
    report = pipeline.step()
    assert report.state == BatchState.SUCCEEDED
    assert source.group_reads == 1 and source.split_reads == 0
    out = tables(tmp_path, "p")
    assert sorted(r["user"] for r in out["clicks"]) == expected["clicks"]
    assert sorted(r["page"] for r in out["views"]) == expected["views"]
    counts = {(r.split.partition, r.split.start): (r.rows, r.earliest, r.latest) for r in report.results}
    assert counts == {
        ("a", 0): (3, 0, 2),
        ("a", 3): (3, 3, 5),
        ("a", 6): (1, 6, 6),
        ("b", 0): (2, 0, 1),
        ("c", 0): (3, 0, 2),
        ("c", 3): (1, 3, 3),
    }
    assert sum(len(r.files) for r in report.results) == 2  # one file per output for the task


def test_a_failing_group_is_read_split_by_split_and_only_the_bad_splits_are_skipped(tmp_path):
    source = GroupSource(poison=frozenset({"b"}))
    expected = _fill(source)
    knobs = Settings(max_retries=0, retry_backoff=0, stop_on_error=False)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), data_plane=LocalDataPlane(), settings=knobs)
    with pytest.raises(BatchFailed) as info:
        pipeline.step()
    report = info.value.report
    failed = [r.split.partition for r in report.results if r.error]
    assert failed == ["b"], failed
    assert "corrupt record in b" in next(r.error for r in report.results if r.error)
    pipeline.run()
    out = tables(tmp_path, "p")
    assert sorted(r["user"] for r in out["clicks"]) == expected["clicks"]  # nothing of a or c skipped
    assert out["views"] == []
    assert [(s.partition, s.start, s.end) for s in pipeline.remap.skips] == [("b", 0, 2)]

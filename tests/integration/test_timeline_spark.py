"""The Spark variant of one cut across pipelines: ``read_as_of_spark(spark, lake, [...], T)``.

Checked from outside against pyarrow over each table's files, filtered to ``_into_ts <= T``.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from reclock.persist.asof import read_as_of_spark
from reclock.runtime.pipeline import Pipeline
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash


def test_spark_reads_one_cut_across_pipelines_and_refuses_past_their_joint_upper(spark, tmp_path):
    clock = FakeClock(1_000)
    sources = {name: MemorySource({"rows": pa.schema([("n", pa.int64())])}) for name in ("a", "b")}
    for ms in (1_000, 2_000, 3_000):
        clock.ms = ms
        for name, source in sources.items():
            source.append(ms // 1_000 % 2, "rows", [{"n": ms + i} for i in range(3)])
            crash = CrashAt("committed:rows") if (name, ms) == ("b", 3_000) else None
            with contextlib.suppress(SimulatedCrash):
                Pipeline(name, tmp_path, source, now=clock, on_step=crash).step()
    with pytest.raises(ValueError, match=r"joint readable upper is 2001 \(held back by 'b'\)"):
        read_as_of_spark(spark, tmp_path, ["a", "b"], 2_001)
    for as_of in (1_000, 1_999, 2_000):
        frames = read_as_of_spark(spark, tmp_path, ["a", "b"], as_of)
        assert set(frames) == {"a", "b"} and all(set(f) == {"rows", "_errors"} for f in frames.values())
        for name, outputs in frames.items():
            table = DeltaTable(f"{tmp_path}/{name}/outputs/rows")
            outside = pq.read_table(table.file_uris(), filters=[("_into_ts", "<=", as_of)])
            got = sorted(r["n"] for r in outputs["rows"].select("n").collect())
            assert got == sorted(outside["n"].to_pylist()), (name, as_of)
            assert len(got) == 3 * (as_of // 1_000)

"""The "in" adapter: plain PySpark ``DataSourceStreamReader`` s run as reclock sources.

The readers here import nothing of reclock: they are what a Spark user already has. Outside
checks read the Delta tables with deltalake/pyarrow, against the records the test wrote.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from reclock import Frontier
from reclock.errors import ConfigError, DefiniteSourceError
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.sources.pyspark_in import OrderedOffsets, StreamReaderSource, arrow_schema
from reclock.testing import CrashAt, FakeClock, SimulatedCrash

#: Shared "upstream" of the readers below, per test: key -> values (appended only).
LOG: dict[str, list[int]] = {}


class Range(InputPartition):
    def __init__(self, key: str, start: int, end: int) -> None:
        self.key, self.start, self.end = key, start, end


class KeyedReader(DataSourceStreamReader):
    """Offsets ``{key: count}``; reads ``(key, value)`` rows."""

    def __init__(self, skew: int = 0) -> None:
        self.skew = skew  # > 0: yields that many extra rows per range, a broken offset contract
        self.committed: list[dict] = []

    def initialOffset(self) -> dict:
        return {}

    def latestOffset(self, start: dict, limit) -> dict:
        return {key: len(values) for key, values in sorted(LOG.items())}

    def partitions(self, start: dict, end: dict) -> list[Range]:
        return [Range(k, start.get(k, 0), e) for k, e in sorted(end.items()) if e > start.get(k, 0)]

    def read(self, partition: Range):
        values = LOG[partition.key][partition.start : partition.end] + [0] * self.skew
        yield from ((partition.key, v) for v in values)

    def commit(self, end: dict) -> None:
        self.committed.append(end)


class NestedReader(DataSourceStreamReader):
    """One stream with a nested offset ``{"log": {"index": n}}``, read as Arrow batches."""

    def initialOffset(self) -> dict:
        return {"log": {"index": 0}}

    def latestOffset(self) -> dict:  # the pre-4.2 signature
        return {"log": {"index": len(LOG.get("only", []))}}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition((start["log"]["index"], end["log"]["index"]))]

    def read(self, partition: InputPartition):
        lo, hi = partition.value
        yield pa.RecordBatch.from_pydict({"key": ["only"] * (hi - lo), "value": LOG["only"][lo:hi]})


class Keyed(DataSource):
    @classmethod
    def name(cls) -> str:
        return "keyed-test"

    def schema(self) -> str:
        return "key string, value bigint"

    def streamReader(self, schema):
        return NestedReader() if self.options.get("nested") else KeyedReader(int(self.options.get("skew", 0)))


def position(offset: dict) -> int:
    return offset["log"]["index"]


def offset_at(position: int) -> dict:
    return {"log": {"index": position}}


@pytest.fixture(autouse=True)
def fresh_log():
    LOG.clear()
    yield
    LOG.clear()


def _rows(lake, name: str = "t", output: str = "keyed_test") -> list[tuple]:
    table = DeltaTable(f"{lake}/{name}/outputs/{output}").to_pyarrow_table()
    return sorted(zip(*(table[c].to_pylist() for c in ("_partition", "_offset", "value", "_into_ts")), strict=True))


def test_keys_are_partitions_and_records_get_consecutive_offsets(tmp_path):
    source = StreamReaderSource(Keyed({}))
    clock = FakeClock(1_000)
    pipeline = Pipeline("t", tmp_path, source, data_plane=LocalDataPlane(), now=clock)
    LOG["a"] = [10, 11]
    pipeline.step()
    clock.ms = 2_000
    LOG["a"].append(12)
    LOG["b"] = [20]
    pipeline.step()
    assert _rows(tmp_path) == [("a", 0, 10, 1000), ("a", 1, 11, 1000), ("a", 2, 12, 2000), ("b", 0, 20, 2000)]
    assert source.reader.committed[-1] == {"a": 3, "b": 1}  # commit(end) gets the resume frontier
    assert pickle.loads(pickle.dumps(source)).upper() == Frontier({"a": 3, "b": 1})


def test_nested_offsets_run_as_one_ordered_stream_with_a_codec(tmp_path):
    source = StreamReaderSource(Keyed({"nested": "1"}), codec=OrderedOffsets(position, offset_at, partition="only"))
    LOG["only"] = [1, 2, 3]
    Pipeline("t", tmp_path, source, data_plane=LocalDataPlane(), now=FakeClock(1_000)).step()
    assert _rows(tmp_path) == [("only", 0, 1, 1000), ("only", 1, 2, 1000), ("only", 2, 3, 1000)]


def test_nested_offsets_without_a_codec_are_refused_by_name():
    with pytest.raises(DefiniteSourceError, match=r"not \{key: int\}.*OrderedOffsets"):
        StreamReaderSource(Keyed({"nested": "1"}))  # its initialOffset already tells


def test_a_range_that_reads_more_records_than_its_offsets_count_fails_the_split():
    source = StreamReaderSource(Keyed({"skew": "1"}))
    LOG["a"] = [1, 2]
    [split] = source.splits(Frontier(), source.upper())
    with pytest.raises(DefiniteSourceError, match="offsets that count records"):
        list(source.read(split))


@pytest.mark.parametrize("step", ["minted", "written", "committed:keyed_test", "committed:_errors", "resumed"])
def test_crash_anywhere_then_restart_equals_an_uninterrupted_run(tmp_path, step):
    def run(lake, crash: str | None) -> list[tuple]:
        LOG.clear()
        source, clock = StreamReaderSource(Keyed({})), FakeClock(1_000)
        for ms, key, values in [(1_000, "a", [1, 2]), (2_000, "b", [3]), (3_000, "a", [4, 5])]:
            clock.ms = ms
            LOG.setdefault(key, []).extend(values)
            try:
                Pipeline("t", lake, source, now=clock, on_step=CrashAt(crash) if crash else None).step()
            except SimulatedCrash:
                Pipeline("t", lake, source, now=clock).step()
        return _rows(lake)

    assert run(tmp_path / "crashed", step) == run(tmp_path / "clean", None)


def test_ddl_schemas_become_arrow_and_unknown_types_name_the_field():
    assert arrow_schema("a string, b bigint not null") == pa.schema(
        [pa.field("a", pa.string()), pa.field("b", pa.int64(), nullable=False)]
    )
    with pytest.raises(ConfigError, match="schema: cannot read the DDL column 'a array<int>'"):
        arrow_schema("a array<int>")


def test_a_pipeline_definition_names_the_data_source_class_and_its_options(tmp_path):
    from reclock.job.config import build_source, parse_config

    definition = {
        "pipeline": {"name": "t", "lake": str(tmp_path), "engine": "local"},
        "source": {
            "kind": "reclock.sources.pyspark_in:StreamReaderSource",
            "data_source": "tests.unit.test_pyspark_in:Keyed",
            "options": {"skew": 0},
            "output": "keyed",
        },
    }
    source = build_source(parse_config(definition), created_at_ms=0)
    LOG["a"] = [7]
    Pipeline("t", tmp_path, source, data_plane=LocalDataPlane(), now=FakeClock(1_000)).step()
    assert _rows(tmp_path, output="keyed") == [("a", 0, 7, 1000)]
    definition["source"]["data_source"] = "tests.unit.test_pyspark_in:Range"
    with pytest.raises(ConfigError, match=r"source\.data_source: must name a pyspark DataSource class"):
        build_source(parse_config(definition), created_at_ms=0)


def test_arrow_rows_that_do_not_cast_go_to_errors_and_the_rest_land(tmp_path):
    source = StreamReaderSource(Keyed({"nested": "1"}), codec=OrderedOffsets(position, offset_at, partition="only"))
    LOG["only"] = ["1", "x", "3"]  # the reader yields a string column; the schema says bigint
    Pipeline("t", tmp_path, source, data_plane=LocalDataPlane(), now=FakeClock(1_000)).step()
    assert _rows(tmp_path) == [("only", 0, 1, 1000), ("only", 2, 3, 1000)]
    errors = DeltaTable(f"{tmp_path}/t/outputs/_errors").to_pyarrow_table()
    assert errors.select(["_partition", "_offset", "kind"]).to_pylist() == [
        {"_partition": "only", "_offset": 1, "kind": "schema"}
    ]

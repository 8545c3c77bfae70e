"""The "out" adapter's mapping, driven the way Spark drives a Python data source, without a JVM.

Spark calls these methods in its Python workers; here the test calls them in the same order
(pickling what Spark pickles) and compares the rows with what the generator itself reads. The
real Spark read against a real broker is ``tests/integration/kafka/test_pyspark_out.py``.
"""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from reclock.errors import ConfigError
from reclock.job.pyspark_out import GeneratorDataSource
from reclock.sources.base import Split
from reclock.sources.generator import GeneratorSource
from reclock.timeline.frontier import encode_partition


def _truth(limit: int, output: str = "bids") -> set[tuple[str, int]]:
    source = GeneratorSource(partitions=2, limit=limit)
    rows: set[tuple[str, int]] = set()
    for index, end in enumerate(source.partition_limits or ()):
        for name, batch in source.read(Split(f"gen-{index}", 0, end)):
            if name == output:
                rows |= set(zip(batch["_partition"].to_pylist(), batch["_offset"].to_pylist(), strict=True))
    return rows


def _read(reader, partitions) -> list[tuple[str, int]]:
    shipped = pickle.loads(pickle.dumps(reader))  # what Spark sends to a task
    out: list[tuple[str, int]] = []
    for part in partitions:
        for batch in shipped.read(pickle.loads(pickle.dumps(part))):
            out += zip(batch["_partition"].to_pylist(), batch["_offset"].to_pylist(), strict=True)
    return out


def test_a_batch_read_plans_the_whole_bounded_source_and_reads_each_record_once():
    source = GeneratorDataSource({"partitions": "2", "limit": "500", "output": "bids"})
    schema = source.schema()
    assert schema.fieldNames()[:2] == ["_partition", "_offset"]
    reader = pickle.loads(pickle.dumps(source)).reader(schema)
    rows = _read(reader, reader.partitions())
    assert len(rows) == len(set(rows)) and set(rows) == _truth(500)


def test_a_streaming_read_covers_every_record_once_across_capped_micro_batches():
    source = GeneratorDataSource({"partitions": "2", "limit": "500", "output": "bids"})
    reader = source.streamReader(source.schema())
    start, rows, batches = reader.initialOffset(), [], 0
    while True:
        end = reader.latestOffset(start, ReadMaxRows(120))
        if end == start:
            break
        rows += _read(reader, reader.partitions(start, end))
        reader.commit(end)
        start, batches = end, batches + 1
    assert batches == 5  # 500 offsets, 120 a micro-batch
    assert start == {encode_partition("gen-0"): 250, encode_partition("gen-1"): 250}
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    assert len(rows) == len(set(rows)) and set(rows) == _truth(500)


def test_the_errors_output_can_be_read_and_a_missing_choice_is_named():
    assert GeneratorDataSource({"limit": "10", "output": "_errors"}).schema().fieldNames()[2:] == [
        "kind",
        "message",
        "raw",
    ]
    with pytest.raises(ConfigError, match="output: reclock-generator has outputs persons, auctions, bids"):
        GeneratorDataSource({"limit": "10"}).schema()
    with pytest.raises(ConfigError, match="partitionz: unknown option of reclock-generator"):
        GeneratorDataSource({"partitionz": "2", "output": "bids"}).schema()


def test_spark_column_types_come_from_the_outputs_arrow_schema():
    schema = GeneratorDataSource({"limit": "10", "output": "persons"}).schema()
    source = GeneratorSource(limit=10)
    persons = next(o for o in source.outputs() if o.name == "persons")
    assert schema.fieldNames() == ["_partition", "_offset", *persons.schema.names]


def test_reclock_files_reads_every_line_of_the_folder_once(tmp_path):
    from reclock.job.pyspark_out import FilesDataSource

    for name, values in (("a.jsonl", range(3)), ("b.jsonl", range(3, 5))):
        (tmp_path / name).write_text("".join(f'{{"n": {v}}}\n' for v in values))
    source = FilesDataSource({"path": str(tmp_path), "columns": '{"n": "int64"}'})
    reader = source.reader(source.schema())
    rows = []
    for part in reader.partitions():
        for batch in pickle.loads(pickle.dumps(reader)).read(part):
            rows += batch.column("n").to_pylist()
    assert sorted(rows) == [0, 1, 2, 3, 4]

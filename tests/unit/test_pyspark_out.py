"""The "out" adapter's mapping, driven the way Spark drives a Python data source, without a JVM.

Spark calls these methods in its Python workers; here the test calls them in the same order
(pickling what Spark pickles) and compares the rows with what the generator itself reads. The
real Spark read against a real broker is ``tests/integration/kafka/test_pyspark_out.py``.
"""

from __future__ import annotations

import json
import pickle
import time
from io import BytesIO

import pytest
from pyspark.serializers import UTF8Deserializer, write_with_length
from pyspark.sql.streaming import python_streaming_source_runner as runner
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


def _spark_calls(reader, start: dict) -> dict:
    """One micro-batch's planning as Spark's planner worker does it: the default read limit, sent
    to the JVM as JSON, then ``latestOffset(start, limit)`` with that limit rebuilt from the JSON."""
    said = BytesIO()
    runner.get_default_read_limit_func(reader, said)
    limit = UTF8Deserializer().loads(BytesIO(said.getvalue()))
    asked = BytesIO()
    write_with_length(json.dumps(start).encode(), asked)
    write_with_length(limit.encode(), asked)
    asked.seek(0)
    answer = BytesIO()
    runner.latest_offset_admission_control_func(reader, asked, answer)
    return json.loads(UTF8Deserializer().loads(BytesIO(answer.getvalue())))


def test_max_records_per_trigger_reaches_the_reader_as_its_default_read_limit():
    options = {"partitions": "2", "limit": "500", "output": "bids", "maxRecordsPerTrigger": "120"}
    source = GeneratorDataSource(options)
    reader = pickle.loads(pickle.dumps(source)).streamReader(source.schema())  # Spark pickles the source
    supported = BytesIO()
    runner.check_support_func(reader, supported)
    flags = int.from_bytes(supported.getvalue(), "big")
    assert flags & runner.SUPPORTS_ADMISSION_CONTROL and flags & runner.SUPPORTS_TRIGGER_AVAILABLE_NOW
    assert reader.getDefaultReadLimit() == ReadMaxRows(120)
    start, rows, sizes = reader.initialOffset(), [], []
    while (end := _spark_calls(reader, start)) != start:
        sizes.append(sum(end.values()) - sum(start.values()))
        rows += _read(reader, reader.partitions(start, end))
        reader.commit(end)
        start = end
    assert sizes == [120, 120, 120, 120, 20]
    assert len(rows) == len(set(rows)) and set(rows) == _truth(500)


def test_an_unbounded_generator_stream_starts_now_and_not_at_the_epoch():
    source = GeneratorDataSource({"partitions": "4", "rate": "100000", "output": "bids"})
    before = time.time()
    reader = source.streamReader(source.schema())
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    elapsed = time.time() - before
    # what appeared since, not since 1970: the source's clock ticks in whole milliseconds, so a tick
    # between the two reads (100 events at this rate) may fall in far less than a millisecond
    assert sum(end.values()) - sum(start.values()) <= 100_000 * (elapsed + 0.001) + 4
    assert len(reader.partitions(start, end)) <= 4
    earliest = GeneratorDataSource(
        {"partitions": "4", "rate": "100000", "output": "bids", "startingOffsets": "earliest"}
    )
    assert earliest.streamReader(earliest.schema()).initialOffset() == {}  # asked for: from anchor_ms (the epoch)


def test_trigger_available_now_reads_what_existed_when_the_query_started_and_stops():
    source = GeneratorDataSource({"partitions": "2", "rate": "1000000", "output": "bids", "maxRecordsPerTrigger": "7"})
    reader = source.streamReader(source.schema())
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    target = reader.latestOffset(start, ReadAllAvailable())
    time.sleep(0.05)  # 50,000 more records exist now
    assert reader.latestOffset(start, ReadAllAvailable()) == target
    assert sum(reader.latestOffset(start, ReadMaxRows(7)).values()) - sum(start.values()) == min(
        7, sum(target.values()) - sum(start.values())
    )


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"maxRecordsPerTrigger": "0"}, "maxrecordspertrigger: must be a whole number of rows >= 1, got '0'"),
        ({"maxRecordsPerTrigger": "ten"}, "maxrecordspertrigger: must be a whole number"),
        ({"startingOffsets": "middle"}, "startingoffsets: must be earliest or latest, got 'middle'"),
    ],
)
def test_a_wrong_stream_option_is_named(options, says):
    source = GeneratorDataSource({"limit": "10", "output": "bids", **options})
    with pytest.raises(ConfigError, match=says):
        source.streamReader(source.schema())
    with pytest.raises(ConfigError, match="is an option of a streaming read"):
        source.reader(source.schema())

"""The "out" adapter against the real broker: Spark reads a topic through reclock's Kafka source.

Ground truth is what the producer got acked: ``(topic, partition, offset)`` per value. The rows
Spark returns must be exactly those records, each once, with no JVM Kafka connector involved.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from reclock.job.pyspark_out import register
from reclock.timeline.frontier import encode_partition


@pytest.fixture(scope="module")
def reclock_spark(spark):
    register(spark)
    return spark


def _produced(produce, topic: str, n: int, partitions: int, tag: str = "") -> Counter:
    values = [f"{tag}v{i}".encode() for i in range(n)]
    keys = [f"k{i}".encode() for i in range(n)]
    acked = produce.send(topic, values, keys=keys, partition=lambda i: i % partitions)
    return Counter((encode_partition((t, p)), o, k, v) for (t, p, o), k, v in zip(acked, keys, values, strict=True))


def _rows(frame) -> Counter:
    return Counter(
        (r["_partition"], r["_offset"], bytes(r["key"]), bytes(r["value"]))
        for r in frame.select("_partition", "_offset", "key", "value").collect()
    )


def test_spark_batch_read_returns_exactly_the_records_the_producer_got_acked(reclock_spark, broker, topic, produce):
    name = topic(partitions=3)
    truth = _produced(produce, name, 60, 3)
    frame = (
        reclock_spark.read.format("reclock-kafka")
        .option("bootstrap", broker.bootstrap)
        .option("topic", name)
        .option("metadata", '["key"]')
        .load()
    )
    assert frame.columns == ["_partition", "_offset", "value", "key"]
    assert _rows(frame) == truth  # every acked record, each exactly once, at its own coordinates


def test_spark_batch_read_starts_at_given_offsets(reclock_spark, broker, topic, produce):
    name = topic(partitions=2)
    truth = _produced(produce, name, 20, 2)
    start = {encode_partition((name, 0)): 4}  # partition 1 starts at earliest
    frame = (
        reclock_spark.read.format("reclock-kafka")
        .options(bootstrap=broker.bootstrap, topic=name, metadata='["key"]', start=json.dumps(start))
        .load()
    )
    expected = Counter({r: n for r, n in truth.items() if not (r[0] == encode_partition((name, 0)) and r[1] < 4)})
    assert _rows(frame) == expected and sum(expected.values()) == 20 - 4


def test_a_wrong_option_is_named(reclock_spark, broker, topic):
    with pytest.raises(Exception, match="topicz"):
        reclock_spark.read.format("reclock-kafka").options(bootstrap=broker.bootstrap, topicz="x").load()


def _stream_once(spark, bootstrap: str, topic: str, out: Path, checkpoint: Path) -> list[int]:
    """One run of the query until what exists now is read (``availableNow``); its micro-batch sizes."""
    frame = (
        spark.readStream.format("reclock-kafka")
        .options(bootstrap=bootstrap, topic=topic, metadata='["key"]', maxRecordsPerTrigger="1000")
        .load()
    )
    query = (
        frame.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=600)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_spark_read_stream_takes_every_record_once_across_a_checkpoint_restart(
    reclock_spark, broker, topic, produce, tmp_path
):
    name = topic(partitions=3)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    truth = _produced(produce, name, 4500, 3, tag="a")
    first = _stream_once(reclock_spark, broker.bootstrap, name, out, checkpoint)
    truth += _produced(produce, name, 4500, 3, tag="b")
    second = _stream_once(reclock_spark, broker.bootstrap, name, out, checkpoint)  # resumes at the checkpoint
    assert sum(first) == 4500 and sum(second) == 4500
    assert max(first + second) <= 1000 and len(first) >= 5  # maxRecordsPerTrigger caps every micro-batch
    assert _rows(reclock_spark.read.parquet(str(out))) == truth  # 9,000 records, each exactly once

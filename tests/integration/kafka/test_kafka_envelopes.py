"""Upsert and debezium outputs fed by a real broker: keyed records, tombstones, change events."""

from __future__ import annotations

import json
import random

from reclock.runtime.pipeline import Pipeline
from tests.delta_log import lake_file_schema_mismatches
from tests.integration.kafka.test_kafka_pipeline import _ends, _kafka_source, _rows, _step_until_in


def test_upsert_from_keyed_records_and_tombstones_equals_a_dictionary_replay(broker, topic, produce, tmp_path):
    name = topic(partitions=3)
    rng = random.Random(7)
    keys, values, replay = [], [], {}
    for i in range(600):
        k = f"user-{rng.randrange(40)}"
        v = None if rng.random() < 0.2 else json.dumps({"score": i}).encode()
        keys.append(k.encode())
        values.append(v)
        if v is None:
            replay.pop(k, None)
        else:
            replay[k] = i
    # Kafka's default partitioner keeps a key in one partition, so its order is the topic's order.
    delivered = produce.send(name, values, keys=keys, partition=None)
    source = _kafka_source(
        broker,
        topics=[name],
        outputs={
            "scores": {
                "topics": [name],
                "schema": {"score": "int64"},
                "metadata": {"key": "user"},
                "key_format": "text",
                "key": ["user"],
                "envelope": "upsert",
            }
        },
    )
    pipeline = Pipeline("upserts", tmp_path, source)
    _step_until_in(pipeline, _ends(delivered))
    got = {r["user"]: r["score"] for r in _rows(tmp_path, "upserts", "scores")}
    assert got == replay
    assert _rows(tmp_path, "upserts", "_errors") == []
    assert lake_file_schema_mismatches(tmp_path) == []  # the MERGE's files and the tasks' alike


def test_debezium_change_events_leave_the_latest_row_per_key(broker, topic, produce, tmp_path):
    name = topic(partitions=1)

    def event(op: str, before: dict | None, after: dict | None) -> bytes:
        return json.dumps({"before": before, "after": after, "op": op, "ts_ms": 1}).encode()

    events = [
        event("r", None, {"id": 1, "email": "ann@a"}),
        event("c", None, {"id": 2, "email": "bob@b"}),
        event("u", {"id": 1, "email": "ann@a"}, {"id": 1, "email": "ann@new"}),
        event("c", None, {"id": 3, "email": "cy@c"}),
        event("d", {"id": 2, "email": "bob@b"}, None),
    ]
    delivered = produce.send(name, events)
    source = _kafka_source(
        broker,
        topics=[name],
        outputs={
            "users": {
                "topics": [name],
                "schema": {"id": "int64", "email": "string"},
                "key": ["id"],
                "envelope": "debezium",
            }
        },
    )
    pipeline = Pipeline("cdc", tmp_path, source)
    _step_until_in(pipeline, _ends(delivered))
    assert {r["id"]: r["email"] for r in _rows(tmp_path, "cdc", "users")} == {1: "ann@new", 3: "cy@c"}
    assert lake_file_schema_mismatches(tmp_path) == []  # the MERGE's files and the tasks' alike

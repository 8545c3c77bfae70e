"""Schema evolution from a real broker (issue 12, acceptance 2): a JSON topic and an Avro topic
whose producer moves to a writer schema with a new field, mid-run. Checked by replaying the
``_delta_log`` by hand (tests.delta_log) against the coordinates the broker acknowledged."""

from __future__ import annotations

import io
import json
import time

import fastavro
import pytest

from reclock.persist.lake import Lake
from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.sources.kafka import KafkaSource, output_name_for
from tests.delta_log import replay

V1 = {"type": "record", "name": "bid", "fields": [{"name": "id", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "bid",
    "fields": [{"name": "id", "type": "long"}, {"name": "color", "type": ["null", "string"], "default": None}],
}


def _framed(schema: dict, schema_id: int, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\0" + schema_id.to_bytes(4, "big") + out.getvalue()


def _step_until(pipeline: Pipeline, topic: str, end: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pipeline.resume_frontier().covers((topic, 0), end - 1):
        assert time.monotonic() < deadline, f"offsets below {end} not in after {timeout}s"
        if pipeline.step().idle:
            time.sleep(0.05)


def _rows(tmp_path, output: str) -> dict[int, dict]:
    state = replay(Lake.at(tmp_path).output_path("p", output))
    return {row["_offset"]: row for row in state.rows()}


@pytest.mark.parametrize("mode", ["add", "rescue"])
def test_a_json_topic_that_gains_a_field_lands_it_by_the_policy(broker, topic, produce, tmp_path, mode):
    name = topic()
    source = KafkaSource(broker.bootstrap, topics=[name], format="json", schema={"id": "int64"}, read_timeout_s=5.0)
    pipeline = Pipeline("p", tmp_path, source, layouts={output_name_for(name): OutputLayout(schema_evolution=mode)})
    output = output_name_for(name)
    first = produce.send(name, [json.dumps({"id": i}).encode() for i in range(3)])
    _step_until(pipeline, name, first[-1][2] + 1)
    later = produce.send(name, [json.dumps({"id": 3, "color": "red"}).encode(), json.dumps({"id": 4}).encode()])
    _step_until(pipeline, name, later[-1][2] + 1)
    rows = _rows(tmp_path, output)
    assert sorted(r["id"] for r in rows.values()) == [0, 1, 2, 3, 4]
    at = {offset: i for i, (_, _, offset) in enumerate(first + later)}
    if mode == "add":
        assert {at[o]: r["color"] for o, r in rows.items()} == {0: None, 1: None, 2: None, 3: "red", 4: None}
    else:
        assert {at[o]: r["_rescued"] for o, r in rows.items()} == {
            0: None,
            1: None,
            2: None,
            3: '{"color":"red"}',
            4: None,
        }


def test_an_avro_topic_whose_writer_schema_gains_a_field_lands_it_under_add(broker, topic, produce, tmp_path):
    name = topic()
    source = KafkaSource(
        broker.bootstrap,
        topics=[name],
        format="avro",
        avro_schema=V1,
        confluent=True,
        avro_writer_schemas={"2": V2},
        read_timeout_s=5.0,
    )
    pipeline = Pipeline("p", tmp_path, source, layouts={output_name_for(name): OutputLayout(schema_evolution="add")})
    output = output_name_for(name)
    first = produce.send(name, [_framed(V1, 1, {"id": i}) for i in range(2)])
    _step_until(pipeline, name, first[-1][2] + 1)
    later = produce.send(name, [_framed(V2, 2, {"id": 2, "color": "blue"}), _framed(V2, 2, {"id": 3, "color": None})])
    _step_until(pipeline, name, later[-1][2] + 1)
    rows = _rows(tmp_path, output)
    assert {r["id"]: r["color"] for r in rows.values()} == {0: None, 1: None, 2: "blue", 3: None}
    assert {f["name"]: f["type"] for f in replay(Lake.at(tmp_path).output_path("p", output)).schema}[
        "color"
    ] == "string"

"""``reclock set-offsets`` on Kafka: skip ahead and re-read, each exactly once, shown in ``offsets``.

Ground truth is what the producer got acked. A re-read lands its records a second time under
their own partition (``["topic",0,"@reread-1"]``), in a batch that also reads the live range of
the same Kafka partition; the consumer group keeps the live partition's offset. The lake is read
with the test's own Delta-log reader.
"""

from __future__ import annotations

import json
from collections import Counter

from kafka import KafkaConsumer, TopicPartition

from reclock.persist.lake import Lake
from reclock.timeline.frontier import encode_partition
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, read_rows
from tests.integration.helpers import write_config
from tests.waiting import run_until


def _offsets(lake, name: str) -> dict[str, dict]:
    shown = reclock_in_process("--lake", str(lake), "offsets", name, "--json")
    assert shown.returncode == 0, shown.stderr
    return {row["partition"]: row for row in json.loads(shown.stdout)}


def test_skip_ahead_and_re_read_of_a_kafka_partition_each_land_exactly_once(broker, topic, produce, tmp_path):
    t = topic(partitions=1)
    group = f"g-{t}"
    first = produce.send(t, [json.dumps({"id": i}).encode() for i in range(40)])
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "moves", "lake": str(lake), "engine": "local"},
        source={
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap,
            "topics": [t],
            "format": "json",
            "schema": {"id": "int64"},
            "group_id": group,
        },
    )
    assert reclock_in_process("create", str(config)).returncode == 0
    output = lake / "moves" / "outputs" / t.replace("-", "_")

    def row_count() -> int:
        table = read_rows(DeltaLog(output).refresh())
        return table.num_rows if table is not None else 0

    run_until(Lake.at(str(lake)), "moves", lambda: row_count() >= 40, "the first 40 records")  # a live source
    live = encode_partition((t, 0))
    assert _offsets(lake, "moves")[live]["loaded"] == 40

    # Skip ahead: 40..49 are never loaded on the live partition. Then a re-read from 10 reads
    # everything now bound again, [10, 50), as generation 1: the skipped range too, as asked.
    produce.send(t, [json.dumps({"id": i}).encode() for i in range(40, 60)])
    skip = reclock_in_process("--lake", str(lake), "set-offsets", "moves", live, "50")
    assert skip.returncode == 0 and "skips offsets [40, 50)" in skip.stdout, skip.stdout + skip.stderr
    again = reclock_in_process("--lake", str(lake), "set-offsets", "moves", live, "10")
    copy = encode_partition((t, 0, "@reread-1"))
    assert again.returncode == 0 and f"re-reads offsets [10, 50) as partition {copy}" in again.stdout, again.stderr
    low = reclock_in_process("--lake", str(lake), "set-offsets", "moves", copy, "3")
    assert low.returncode == 2 and "is a re-read" in low.stderr

    run_until(Lake.at(str(lake)), "moves", lambda: row_count() >= 40 + 10 + 40, "the rest and the re-read")
    rows = read_rows(DeltaLog(lake / "moves" / "outputs" / t.replace("-", "_")).refresh()).to_pylist()
    landed = Counter((r["_partition"], r["_offset"], r["id"]) for r in rows)
    expected = Counter({(live, o, o): 1 for o in [*range(40), *range(50, 60)]})
    expected.update({(copy, o, o): 1 for o in range(10, 50)})
    assert landed == expected
    errors = read_rows(DeltaLog(lake / "moves" / "outputs" / "_errors").refresh()).to_pylist()
    assert [(e["kind"], e["_partition"], e["_offset"]) for e in errors] == [("skipped", live, 40)]
    shown = _offsets(lake, "moves")
    assert (shown[live]["loaded"], shown[live]["skipped"]) == (60, 10)
    assert (shown[copy]["latest"], shown[copy]["loaded"], shown[copy]["skipped"]) == (50, 50, 0)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:  # the group holds the live partition's position, never the re-read's
        assert consumer.committed(TopicPartition(t, 0)) == 60
    finally:
        consumer.close()
    assert len(first) == 40

"""Wide topics against a real broker (embedded Tansu): what a thousand small partitions cost.

The cost is measured where it is paid, in the broker process: its CPU time (``/proc/<pid>/stat``)
while the source probes, against its CPU time while the same topic is read whole. Record counts
are checked against the producer's delivery coordinates.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import pyarrow as pa

from reclock.sources.kafka import KafkaSource
from reclock.timeline.frontier import Frontier

PARTITIONS = 1_000


def _broker_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the broker process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_first_probe_of_a_wide_topic_asks_for_ends_not_records(broker, topic, produce):
    """A first probe fetches each new partition from inside its last batch, which on a topic of
    small partitions is all of it: before the probe capped its response, the first probe of 1,000
    partitions made the broker send the whole topic, as much work as reading it."""
    name = topic(partitions=PARTITIONS)
    values = [json.dumps({"id": i, "pad": "x" * 80}).encode() for i in range(20 * PARTITIONS)]
    # A partition's records one after the other: the producer batches each partition whole, as
    # a topic of small partitions mostly is (round robin would make batches of one record here).
    delivered = produce.send(name, values, partition=lambda i: i // 20)
    expected = dict(Counter((t, p) for t, p, _ in delivered))
    source = KafkaSource(broker.bootstrap, topics=[name], format="json", schema=pa.schema([("id", pa.int64())]))
    try:
        before = _broker_cpu_s(broker.pid)
        upper = source.upper()
        probe_cpu = _broker_cpu_s(broker.pid) - before
        deadline = time.monotonic() + 10
        while any(upper.offset(p) < n for p, n in expected.items()) and time.monotonic() < deadline:
            upper = source.upper()
        assert {p: upper.offset(p) for p in expected} == expected
        splits = source.splits(Frontier(), upper)
        before = _broker_cpu_s(broker.pid)
        rows = sum(batch.num_rows for _, batch in source.read_group(splits))
        read_cpu = _broker_cpu_s(broker.pid) - before
    finally:
        source.close()
    assert rows == len(delivered)
    print(f"broker CPU: first probe {probe_cpu:.3f} s, reading the topic {read_cpu:.3f} s")
    assert probe_cpu * 4 < read_cpu, f"the first probe cost the broker {probe_cpu:.3f} s, reading {read_cpu:.3f} s"

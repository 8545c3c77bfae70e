"""Kafka in and out for the Kafka scenarios: producing fast with librdkafka, and landing topics
with reclock until every record is committed.

Producing many partitions with kafka-python means one batch buffer per partition in its
accumulator and about 27k records/s from Python; librdkafka's producer fills a 1,000-partition
topic in about a second here, with end offsets taken from its delivery reports (Tansu's
``ListOffsets(LATEST)`` cannot be trusted, see :func:`benchmarks.fixtures.produce`).

:func:`land` is what ``kafka_e2e`` and ``kafka_partitions`` time for reclock: a fresh lake, a
:class:`~reclock.runtime.pipeline.Pipeline` over a :class:`~reclock.sources.kafka.KafkaSource` (JSON) on the data
plane given, stepping until the resume frontier holds every produced end offset, then checked
from the outputs' Delta logs (not from the pipeline's own reports).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.fixtures import EVENT_SCHEMA, event_values, workdir
from benchmarks.readback import delta_commits

__all__ = ["Landing", "land", "produce_librdkafka"]


def produce_librdkafka(bootstrap: str, topic: str, count: int, partitions: int) -> dict[int, int]:
    """``count`` JSON events round-robin over ``partitions`` of ``topic``; the end offset of each."""
    from confluent_kafka import KafkaException, Producer

    ends: dict[int, int] = {}
    failures: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
            "log_level": 3,  # Tansu closes idle connections; librdkafka would log each at level 6
        }
    )
    chunk = 50_000
    for start in range(0, count, chunk):
        for i, value in enumerate(event_values(start, min(chunk, count - start))):
            while True:
                try:
                    producer.produce(topic, value, partition=(start + i) % partitions, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise KafkaException(f"{topic}: records still undelivered after 120 s")
    if failures:
        raise KafkaException(f"{topic}: {len(failures)} records not delivered, first: {failures[0]}")
    assert sum(ends.values()) == count, f"{topic}: delivery reports end at {sum(ends.values())} of {count}"
    return ends


@dataclass(frozen=True)
class Landing:
    """One reclock run: seconds until everything was committed, and how rows arrived over time."""

    seconds: float
    steps: int
    committed: list[tuple[float, int]]  # (seconds since start, rows committed after each step)
    written: list[tuple[float, int]]  # (seconds, rows in files written as each split finished)


def land(
    data_plane: Any, bootstrap: str, topics: Sequence[str], ends: Mapping[str, Mapping[int, int]], group: str
) -> Landing:
    """Land ``topics`` into a fresh lake with reclock on ``data_plane``; checked from the Delta logs.

    Timed from the source's construction (consumers connected, tables created) to the step that
    commits the last record, so the fixed costs count.
    """
    from reclock.runtime.pipeline import Pipeline
    from reclock.sources.kafka import KafkaSource

    want = {(t, p): end for t, parts in ends.items() for p, end in parts.items()}
    total = sum(want.values())
    with workdir("reclock") as lake:
        t0, wall0 = time.monotonic(), time.time()
        tasks: list[tuple[float, int]] = []
        source = KafkaSource(bootstrap, topics=list(topics), format="json", schema=EVENT_SCHEMA, group_id=group)
        pipeline = Pipeline("landed", lake, source, data_plane=data_plane)
        committed = [(0.0, 0)]
        rows: Counter[str] = Counter()
        try:
            while not all(pipeline.resume_frontier().offset(p) >= end for p, end in want.items()):
                report = pipeline.step()
                rows.update(report.rows)
                tasks += [((r.started_ms + r.duration_ms) / 1000 - wall0, r.rows) for r in report.results]
                committed.append((time.monotonic() - t0, sum(v for k, v in rows.items() if k != "_errors")))
        finally:
            source.close()
        seconds = time.monotonic() - t0
        landed = {name: sum(c.rows for c in delta_commits(sink.path)) for name, sink in pipeline.sinks.items()}
        assert landed.pop("_errors") == 0, "reclock wrote error rows"
        assert sum(landed.values()) == total, f"reclock landed {landed} of {total}"
    done = list(itertools.accumulate(n for _, n in sorted(tasks)))
    written = [(0.0, 0)] + [(t, n) for (t, _), n in zip(sorted(tasks), done, strict=True)]
    return Landing(seconds, len(committed) - 1, committed, written)

"""The embedded default behind ``reclock demo``: the whole Kafka path with nothing to install by hand.

By default (``source="kafka"``) the demo starts an embedded Kafka-compatible broker
(:class:`~reclock.demo.broker.EmbeddedBroker`, Tansu in memory), creates one topic per output of the
generator's auction workload (``persons``, ``auctions``, ``bids``, 4 partitions each) and starts a
Kafka pipeline (``<lake>/demo``) on them as a normal job (status tables, ``status.json``, progress
lines). Once the job runs, a producer process writes the generator's events to the topics as JSON
with kafka-python, and the pipeline ingests them live. A watcher asks the job to stop once every
output holds every record the producer delivered, then the broker stops. Kafka is unbounded, so the
pipeline ends *stopped*, not *finished*; the demo returns the into time of the consistent cut that
holds all of it.

``source="generator"`` runs the generator straight into the pipeline (no broker, a bounded source
that finishes) and reads as of its closing binding. ``source="postgres"`` starts a PostgreSQL
server and lands bank transfers between two tables, checking the invariant in every cut
(:mod:`reclock.demo.transfers`). ``source="all"`` runs a Kafka, a files, a
generator and a Postgres pipeline on one lake and reads one cut across them
(:mod:`reclock.demo.timeline`).

Production runs in its own process, so on a small machine the producer and the pipeline each get a
core; its speed is kafka-python's per-record ``send()`` (about 25k records/s here whatever the
batching settings, see ``docs/sources/kafka.md``), so with the default sizes the pipeline keeps up
and the lag stays small.
"""

from __future__ import annotations

import tempfile
import threading
from typing import Any, TextIO

from reclock.demo.postgres_server import PostgresServer
from reclock.demo.produce import DEMO_PARTITIONS, ProducerProcess, create_topics, kafka_source
from reclock.demo.timeline import run_timeline_demo
from reclock.demo.transfers import run_transfers_demo
from reclock.errors import ConfigError
from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.status import read_status
from reclock.persist.asof import readable_upper
from reclock.persist.lake import Lake
from reclock.runtime.health import Health
from reclock.timeline.frontier import Frontier, IntoTime

__all__ = ["DEFAULT_EVENTS", "DEFAULT_RATE", "DEMO", "SOURCES", "run_demo"]

#: The demo pipeline's name (its folder in the lake).
DEMO = "demo"
#: What ``run_demo(source=...)`` accepts; ``all`` is :mod:`reclock.demo.timeline`.
SOURCES = ("kafka", "generator", "postgres", "all")
#: ``events`` and ``rate`` when not given: generator events, or (``postgres``) transfers, each a
#: transaction, paced so that the demo's progress shows a few dozen batches.
DEFAULT_EVENTS = {"kafka": 400_000, "generator": 400_000, "postgres": 20_000, "all": 400_000}
DEFAULT_RATE = {"kafka": 50_000.0, "generator": 50_000.0, "postgres": 2_000.0, "all": 50_000.0}

_STOP_POLL_S = 0.2


def run_demo(
    lake: Lake,
    *,
    events: int | None,
    rate: float | None,
    engine: str,
    out: TextIO,
    source: str = "kafka",
    server: PostgresServer | None = None,
) -> IntoTime | None:
    """Run the demo pipeline; the into time to read as of, or ``None`` if it failed.

    ``source="kafka"``: produce ``events`` generator events (at most ``rate`` a second) to an
    embedded broker while a Kafka pipeline ingests them, until every output holds every record.
    ``source="generator"``: the generator itself is the pipeline's source. ``source="postgres"``:
    ``events`` transfers on a server the demo starts (or ``server``, one already running, which
    ``source="all"`` uses too).
    ``events=None`` and ``rate=None`` are the source's :data:`DEFAULT_EVENTS` and :data:`DEFAULT_RATE`.
    """
    if source not in SOURCES:
        raise ConfigError("source", f"must be one of {', '.join(SOURCES)}, got {source!r}")
    events = DEFAULT_EVENTS[source] if events is None else events
    rate = DEFAULT_RATE[source] if rate is None else rate
    if source == "all":
        return run_timeline_demo(lake, events=events, rate=rate, engine=engine, out=out, server=server)
    lake.store.delete_tree(lake.pipeline_dir(DEMO))
    if source == "postgres":
        return run_transfers_demo(lake, DEMO, transfers=events, rate=rate, engine=engine, out=out, server=server)
    if source == "generator":
        return _generator_demo(lake, events=events, rate=rate, engine=engine, out=out)
    return _kafka_demo(lake, events=events, rate=rate, engine=engine, out=out)


# -- the generator straight into the pipeline ------------------------------------------------------


def _generator_demo(lake: Lake, *, events: int, rate: float, engine: str, out: TextIO) -> IntoTime | None:
    config = parse_config(
        {
            "pipeline": _pipeline_section(lake, engine),
            "source": {"kind": "generator", "partitions": DEMO_PARTITIONS, "rate": rate, "limit": events},
        }
    )
    lifecycle.create(config, storage_options=lake.store.options)
    out.write(f"demo: {events:,} auction events at {rate:,.0f}/s -> persons, auctions, bids in {lake.root}/{DEMO}\n")
    pipeline = lifecycle.run(lake, DEMO, progress=out)
    if pipeline.health is Health.FAILED:
        return None
    return min(readable_upper(lake, DEMO), pipeline.remap.bindings.upper) - 1  # the closing binding


def _pipeline_section(lake: Lake, engine: str) -> dict[str, Any]:
    return {"name": DEMO, "lake": str(lake.root), "engine": engine, "batch_interval": 0.2, "max_batch": 100_000}


# -- Kafka: an embedded broker, a producer process, a Kafka pipeline --------------------------------


def _kafka_demo(lake: Lake, *, events: int, rate: float, engine: str, out: TextIO) -> IntoTime | None:
    from reclock.demo.broker import EmbeddedBroker
    from reclock.sources.generator import AUCTIONS, AUCTIONS_SCHEMA, BIDS, BIDS_SCHEMA, PERSONS, PERSONS_SCHEMA

    schemas = {PERSONS: PERSONS_SCHEMA, AUCTIONS: AUCTIONS_SCHEMA, BIDS: BIDS_SCHEMA}
    with tempfile.TemporaryDirectory(prefix="reclock-demo-broker-") as logs, EmbeddedBroker(log_dir=logs) as broker:
        create_topics(broker.bootstrap, list(schemas))
        config = parse_config(
            {
                "pipeline": _pipeline_section(lake, engine),
                "source": kafka_source(broker.bootstrap, schemas),
            }
        )
        lifecycle.create(config, storage_options=lake.store.options)
        out.write(
            f"demo: {events:,} auction events produced as JSON at up to {rate:,.0f}/s to Kafka topics "
            f"{', '.join(schemas)} ({DEMO_PARTITIONS} partitions each) on an embedded broker at {broker.bootstrap},\n"
            f"      ingested live by pipeline {DEMO!r} ({engine} engine) into {lake.root}/{DEMO}\n"
        )
        out.flush()
        producer = ProducerProcess(broker.bootstrap, events, rate)
        watcher = _Watcher(lake, producer, out)
        watcher.start()
        try:
            pipeline = lifecycle.run(lake, DEMO, progress=out)
        finally:
            watcher.done.set()
            watcher.join()
            producer.close()
        if watcher.error is not None:
            out.write(f"demo: {watcher.error}\n")
            return None
        if pipeline.health is Health.FAILED:
            return None
        if not watcher.complete:
            out.write("demo: stopped before every produced record was in the lake\n")
            return None
    return readable_upper(lake, DEMO) - 1  # every output holds every produced record at this cut


class _Watcher(threading.Thread):
    """Starts the producer once the job runs; asks the job to stop once every output holds every
    record the producer delivered.

    It compares the producer's delivery ends (the broker's own offsets) with the resume frontier
    the job publishes in ``status.json``: that frontier is covered by *every* output, durably.
    """

    def __init__(self, lake: Lake, producer: ProducerProcess, out: TextIO) -> None:
        super().__init__(name="reclock-demo-watcher", daemon=True)
        self.lake = lake
        self.producer = producer
        self.out = out
        self.done = threading.Event()
        self.complete = False
        self.error: str | None = None

    def run(self) -> None:
        ends: dict[tuple[str, int], int] | None = None
        while not self.done.wait(_STOP_POLL_S):
            status = read_status(self.lake, DEMO) or {}
            health = status.get("health")
            if health in (Health.FAILED.value, Health.STOPPED.value):
                return
            if not self.producer.started:
                if health == Health.RUNNING.value:  # the job is up (Spark too): produce into it, live
                    self.producer.start()
                    self.out.write("\ndemo: the pipeline is running; producing\n")
                    self.out.flush()
                continue
            if ends is None:
                result = self.producer.result()
                if result is None:
                    continue
                if "error" in result:
                    self.error = f"the producer failed: {result['error']}"
                    lifecycle.request_stop(self.lake, DEMO)
                    return
                ends = result["ends"]
                seconds = max(result["seconds"], 1e-9)
                total = sum(ends.values())
                self.out.write(
                    f"\ndemo: produced {total:,} records in {seconds:.1f} s ({total / seconds:,.0f}/s); "
                    "waiting until every output holds all of them\n"
                )
                self.out.flush()
            resume = Frontier.from_json(status.get("resume_frontier", "{}"))
            if all(resume.covers(partition, end - 1) for partition, end in ends.items() if end > 0):
                self.complete = True
                lifecycle.request_stop(self.lake, DEMO)
                return

"""``reclock demo --source all``: four pipelines on one lake, read as one consistent cut.

A Kafka pipeline (``demo_kafka``: the auction events produced live to an embedded broker, as in
the default demo), a files pipeline (``demo_files``: sensor readings, one JSON-lines file after
another dropped into an inbox folder), a generator pipeline (``demo_generator``: the auction
workload, bounded) and a Postgres pipeline (``demo_postgres``: the transfers of
:mod:`reclock.demo.transfers` between two tables of a server the demo starts) run at the same
time, each as a normal job in a thread of this process. Each stamps its own rows on the one
shared timeline. Once every produced record, every written line and every transfer is in and
their joint upper has passed that moment, the unbounded jobs are asked to stop (the generator
finishes by itself), and the demo returns the newest into time with a consistent cut across all
four, which holds every record of each and in which the bank's total is whole:
:func:`~reclock.persist.asof.latest_cut`, which the CLI reads with ``read_as_of(lake, [...], T)``.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TextIO

from reclock.demo import transfers
from reclock.demo.postgres_server import PostgresServer
from reclock.demo.produce import DEMO_PARTITIONS, ProducerProcess, create_topics, kafka_source
from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.status import read_status
from reclock.persist.asof import latest_cut, read_as_of, readable_upper
from reclock.persist.lake import Lake
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.sources.postgres.source import WAL
from reclock.timeline.frontier import Frontier, IntoTime, wall_clock_ms

__all__ = ["PIPELINES", "run_timeline_demo"]

KAFKA, FILES, GENERATOR, POSTGRES = "demo_kafka", "demo_files", "demo_generator", "demo_postgres"
#: The demo's pipelines, in the order the cut is printed.
PIPELINES = (KAFKA, FILES, GENERATOR, POSTGRES)
#: The pipelines that run until asked to stop.
_UNBOUNDED = (KAFKA, FILES, POSTGRES)
#: The Postgres pipeline's transfers, and their pace (a few seconds of them).
TRANSFERS = 5_000
_TRANSFER_RATE = 1_000.0

_FILES = 20
_LINES_PER_FILE = 250
_FILE_EVERY_S = 0.25
_POLL_S = 0.2
#: Time-only bindings this often while a pipeline is idle, so a finished stream still moves time on.
_IDLE_S = 0.5


def run_timeline_demo(
    lake: Lake, *, events: int, rate: float, engine: str, out: TextIO, server: PostgresServer | None = None
) -> IntoTime | None:
    """Run the four pipelines until all their data is in; the into time of the cut, or ``None``.

    ``server`` is a running Postgres server to use instead of starting one (the tests' own)."""
    from reclock.demo.broker import EmbeddedBroker
    from reclock.sources.generator import AUCTIONS, AUCTIONS_SCHEMA, BIDS, BIDS_SCHEMA, PERSONS, PERSONS_SCHEMA

    for name in PIPELINES:
        lake.store.delete_tree(lake.pipeline_dir(name))
    schemas = {PERSONS: PERSONS_SCHEMA, AUCTIONS: AUCTIONS_SCHEMA, BIDS: BIDS_SCHEMA}
    with (
        tempfile.TemporaryDirectory(prefix="reclock-demo-inbox-") as inbox,
        tempfile.TemporaryDirectory(prefix="reclock-demo-broker-") as logs,
        EmbeddedBroker(log_dir=logs) as broker,
        PostgresServer() if server is None else nullcontext(server) as postgres,
    ):
        create_topics(broker.bootstrap, list(schemas))
        kafka = kafka_source(broker.bootstrap, schemas)
        files_source = {"kind": "files", "path": inbox, "output": "readings", "columns": _READINGS}
        generator_source = {"kind": "generator", "partitions": DEMO_PARTITIONS, "rate": rate, "limit": events}
        bank = transfers.bank_source(transfers.open_bank(postgres))
        for name, source in ((KAFKA, kafka), (FILES, files_source), (GENERATOR, generator_source), (POSTGRES, bank)):
            section = {
                "name": name,
                "lake": str(lake.root),
                "engine": engine,
                "batch_interval": 0.2,
                "idle_interval": _IDLE_S,
                **({"max_batch": 1} if name == POSTGRES else {}),
            }
            lifecycle.create(parse_config({"pipeline": section, "source": source}), storage_options=lake.store.options)
        out.write(
            f"demo: four pipelines on one lake, {lake.root}: {KAFKA} ({events:,} auction events produced live to an "
            f"embedded broker), {FILES} ({_FILES} files of sensor readings dropped into an inbox), {GENERATOR} "
            f"({events:,} events, bounded), {POSTGRES} ({TRANSFERS:,} transfers between two tables of PostgreSQL on "
            f"127.0.0.1:{postgres.port}); {engine} engine\n"
        )
        out.flush()
        return _run(lake, Path(inbox), ProducerProcess(broker.bootstrap, events, rate), postgres, out)


_READINGS = {"sensor": "string", "celsius": "float64"}


def _run(lake: Lake, inbox: Path, producer: ProducerProcess, postgres: PostgresServer, out: TextIO) -> IntoTime | None:
    pipelines: dict[str, Pipeline] = {}
    runners = [
        threading.Thread(target=lambda n=name: pipelines.__setitem__(n, lifecycle.run(lake, n)), name=f"reclock-{name}")
        for name in PIPELINES
    ]
    for runner in runners:
        runner.start()
    writer = threading.Thread(target=_drop_files, args=(inbox,), name="reclock-demo-files", daemon=True)
    problem: str | None = None
    bank: transfers.TransferClients | None = None
    try:
        _wait_running(lake, KAFKA)
        producer.start()
        writer.start()
        bank = transfers.TransferClients(postgres, TRANSFERS, _TRANSFER_RATE)
        out.write("demo: the pipelines are running; producing, dropping files and transferring\n")
        out.flush()
        problem = _wait_complete(lake, producer, writer, bank, postgres) or _time_past(lake, wall_clock_ms())
    finally:
        for name in _UNBOUNDED:
            lifecycle.request_stop(lake, name)
        for runner in runners:
            runner.join()
        producer.close()
        if bank is not None:
            bank.close()
    if problem is not None:
        out.write(f"demo: {problem}\n")
        return None
    failed = [name for name, p in pipelines.items() if p.health is Health.FAILED]
    if failed or len(pipelines) != len(PIPELINES):
        out.write(f"demo: pipelines failed: {', '.join(failed) or 'a job did not return'}\n")
        return None
    cut = latest_cut(lake, PIPELINES)
    money = transfers.total(read_as_of(lake, POSTGRES, cut))
    if money != transfers.TOTAL:
        out.write(f"demo: the bank's total in the cut is {money}, not {transfers.TOTAL}\n")
        return None
    out.write(f"demo: in the cut, {POSTGRES} holds all {TRANSFERS:,} transfers and the total {money:,}\n")
    return cut


def _drop_files(inbox: Path) -> None:
    """One complete file at a time (written aside, then renamed in), so no half file is listed."""
    for index in range(_FILES):
        rows = [
            json.dumps({"sensor": f"s{(index * _LINES_PER_FILE + i) % 7}", "celsius": 15 + (i % 200) / 10})
            for i in range(_LINES_PER_FILE)
        ]
        aside = inbox.parent / f".{inbox.name}-{index}.tmp"
        aside.write_text("\n".join(rows) + "\n")
        aside.rename(inbox / f"readings-{index:03d}.jsonl")
        time.sleep(_FILE_EVERY_S)


def _time_past(lake: Lake, done_ms: IntoTime) -> str | None:
    """Wait until the joint upper of the unbounded pipelines passes ``done_ms``, when every record
    was already in: idle bindings move them on, so the newest cut across the four then holds
    everything of each, whichever of them had its last data first."""
    deadline = time.monotonic() + 30 * _IDLE_S + 30
    while readable_upper(lake, list(_UNBOUNDED)) <= done_ms:
        if time.monotonic() > deadline:
            return f"{', '.join(_UNBOUNDED)} did not move their time past {done_ms}"
        time.sleep(_POLL_S)
    return None


def _wait_running(lake: Lake, name: str) -> None:
    while (read_status(lake, name) or {}).get("health") != Health.RUNNING.value:
        if (read_status(lake, name) or {}).get("health") in (Health.FAILED.value, Health.STOPPED.value):
            return
        time.sleep(_POLL_S)


def _wait_complete(
    lake: Lake,
    producer: ProducerProcess,
    writer: threading.Thread,
    bank: transfers.TransferClients,
    postgres: PostgresServer,
) -> str | None:
    """Wait until every output of the Kafka pipeline holds every delivered record, the files
    pipeline every written line, the Postgres pipeline every transfer (its resume frontier past
    the WAL flushed after the last one), and the generator has finished; a reason to give up, or
    ``None``."""
    ends: dict[Any, int] | None = None
    flushed: int | None = None
    while True:
        time.sleep(_POLL_S)
        statuses = {name: read_status(lake, name) or {} for name in PIPELINES}
        if any(s.get("health") == Health.FAILED.value for s in statuses.values()):
            return "a pipeline failed"
        if any(statuses[name].get("health") == Health.STOPPED.value for name in _UNBOUNDED):
            return "a pipeline stopped before all its data was in"
        if bank.errors:
            return f"a transfer client failed: {bank.errors[0]}"
        if flushed is None and not bank.alive():
            flushed = transfers.flush_lsn(postgres)
        if ends is None:
            result = producer.result()
            if result is not None and "error" in result:
                return f"the producer failed: {result['error']}"
            ends = None if result is None else result["ends"]
            continue
        resume = Frontier.from_json(statuses[KAFKA].get("resume_frontier", "{}"))
        kafka_in = all(resume.covers(p, end - 1) for p, end in ends.items() if end > 0)
        files_in = not writer.is_alive() and statuses[FILES].get("rows", {}).get("readings", 0) == (
            _FILES * _LINES_PER_FILE
        )
        bank_in = flushed is not None and Frontier.from_json(statuses[POSTGRES].get("resume_frontier", "{}")).covers(
            WAL, flushed - 1
        )
        if kafka_in and files_in and bank_in and statuses[GENERATOR].get("finished"):
            return None

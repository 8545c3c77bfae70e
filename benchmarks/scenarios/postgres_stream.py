"""Postgres streaming: a range of committed changes landed by the Postgres source vs the slot's floor.

Every contender gets its own logical replication slot (``pgoutput``), all created before any
change is written, so each reads exactly the same WAL: transactions of 10 changes (4 inserts and
an update in each of two tables, :func:`benchmarks.postgres_load.write_changes`), committed one by
one on the server. Then, alternating:

* **reclock** (Spark plane, and in-driver for reading): a pipeline whose source was created
  before the changes (``snapshot = false``, so its slot starts there), stepped until its resume
  frontier passes the server's flush position after the last change: every change decoded,
  turned into rows, MERGEd into two upsert outputs and committed. Checked by the rows its
  batches wrote (one per change) and no error rows.
* **pg_recvlogical** (the server's own client, C): the slot streamed to the same LSN into
  ``/dev/null``, checked by its exit code (it stops at ``--endpos`` only once it got there).
* **psycopg2's raw loop**: the replication messages counted and dropped, checked by the count.

Target (issue 22, acceptance 5): reclock on Spark >= 0.5x of the baseline's changes/s. Both
baselines decode nothing: they are the floor of reading the slot, so the ratio is the price of
decoding, landing and committing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from benchmarks.baselines import replication_readers
from benchmarks.fixtures import spark, workdir
from benchmarks.harness import Ratio, ScenarioResult
from benchmarks.measure import alternate, load_average, median
from benchmarks.postgres_load import TABLES, create_tables, execute, flush_lsn, seed, server, write_changes

__all__ = ["run"]

SPARK, LOCAL = "reclock, Spark", "reclock, in-driver"
RECVLOGICAL, LOOP = "pg_recvlogical", "psycopg2 raw loop"
PUBLICATION = "bench_stream"


def run(full: bool = False) -> ScenarioResult:
    from reclock.demo.postgres_server import BIN
    from reclock.runtime.planes import LocalDataPlane, SparkDataPlane

    transactions = 50_000 if full else 20_000
    runs = 5 if full else 3
    result = ScenarioResult("postgres_stream")
    pg = server()
    database = f"stream_{int(time.time())}"
    dsn = pg.create_database(database)
    create_tables(dsn)
    seed(dsn)
    execute(dsn, f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}")
    session = spark()
    folders = ExitStack()
    pipelines: dict[str, list[Any]] = {SPARK: [], LOCAL: []}
    slots: dict[str, list[str]] = {RECVLOGICAL: [], LOOP: []}
    for i in range(runs):
        for name, plane in ((SPARK, SparkDataPlane(session)), (LOCAL, LocalDataPlane())):
            root = folders.enter_context(workdir(f"pg-stream-{i}"))
            pipelines[name].append(_pipeline(root, plane, dsn, f"reclock_{'spark' if name == SPARK else 'local'}_{i}"))
        for name in slots:
            slot = f"base_{len(slots[RECVLOGICAL]) + len(slots[LOOP])}"
            execute(dsn, f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
            slots[name].append(slot)
    started = time.monotonic()
    changes = write_changes(dsn, transactions)
    write_s = time.monotonic() - started
    end = flush_lsn(dsn)

    def reclock_run(name: str) -> Callable[[], float]:
        def call() -> float:
            return _stream(pipelines[name].pop(0), end, changes)

        return call

    def recvlogical_run() -> float:
        t0 = time.monotonic()
        replication_readers.pg_recvlogical(BIN / "pg_recvlogical", dsn, slots[RECVLOGICAL].pop(0), PUBLICATION, end)
        return time.monotonic() - t0

    def loop_run() -> float:
        t0 = time.monotonic()
        seen = replication_readers.replication_loop(dsn, slots[LOOP].pop(0), PUBLICATION, end)
        seconds = time.monotonic() - t0
        assert seen == changes, f"the raw loop saw {seen} of {changes} changes"
        return seconds

    contenders = {SPARK: reclock_run(SPARK), LOCAL: reclock_run(LOCAL), RECVLOGICAL: recvlogical_run, LOOP: loop_run}
    with folders:
        times = alternate(contenders, runs)
    rates = {name: changes / median(secs) for name, secs in times.items()}
    over = f"changes/s over {changes:,} changes in {transactions:,} transactions"
    for name, plane, baseline, target in (
        ("reclock on Spark / pg_recvlogical, changes/s", SPARK, RECVLOGICAL, 0.5),
        ("reclock on Spark / psycopg2 raw replication loop, changes/s", SPARK, LOOP, 0.5),
    ):
        detail = f"{rates[plane]:,.0f} vs {rates[baseline]:,.0f} {over}"
        result.ratios.append(Ratio(name, rates[plane] / rates[baseline], target, detail=detail))
    result.notes.append(
        f"reclock in-driver / pg_recvlogical: {rates[LOCAL] / rates[RECVLOGICAL]:.2f} "
        f"({rates[LOCAL]:,.0f} vs {rates[RECVLOGICAL]:,.0f} changes/s)"
    )
    result.measurements.update(
        changes=changes,
        transactions=transactions,
        write_seconds=round(write_s, 1),
        runs=runs,
        seconds={name: [round(s, 3) for s in secs] for name, secs in times.items()},
        changes_per_second={name: round(r) for name, r in rates.items()},
        load_average=load_average(),
    )
    execute(pg.dsn(), f'DROP DATABASE "{database}" WITH (FORCE)')
    return result


def _pipeline(root: Any, plane: Any, dsn: str, slot: str) -> Any:
    """A pipeline whose slot exists (its first step made it) before any change is written."""
    from reclock.runtime.pipeline import Pipeline
    from reclock.sources.postgres.source import PostgresSource

    source = PostgresSource(
        dsn, tables=list(TABLES), slot=slot, publication=PUBLICATION, snapshot=False, state_dir=str(root / "state")
    )
    pipeline = Pipeline("stream", root / "lake", source, data_plane=plane)
    pipeline.step()
    return pipeline


def _stream(pipeline: Any, end: int, changes: int) -> float:
    """Step ``pipeline`` until every output holds every change below ``end``; the seconds."""
    from reclock.sources.postgres.source import WAL

    t0 = time.monotonic()
    written = 0
    while pipeline.resume_frontier().offset(WAL) < end:
        report = pipeline.step()
        assert report.rows.get("_errors", 0) == 0, "reclock wrote error rows"
        written += sum(n for name, n in report.rows.items() if name != "_errors")
    seconds = time.monotonic() - t0
    pipeline.source.close()
    assert written == changes, f"reclock wrote {written} rows for {changes} changes"
    return seconds

"""The land stage: step 4 of a batch, its splits read, stamped, shaped and written as parquet files.

The data plane runs the batch's tasks (:mod:`reclock.runtime.task`, wherever
:mod:`reclock.runtime.planes` runs them), or, for a batch landed ahead of its binding, the
landing's results stand for them (:mod:`reclock.runtime.ahead`). Nothing is visible yet: the
files belong to no table until the commit stage. So a batch that cannot commit discards them
here and raises:

* some split failed: :class:`~reclock.runtime.reports.BatchFailed`, with which splits (the loop
  retries, skips or fails, :mod:`reclock.runtime.failures`);
* a file brings a column its output may not take (``schema_evolution``):
  :class:`~reclock.persist.evolution.SchemaEvolutionError`, the schema refused before any commit.

What a batch gave up (:mod:`reclock.runtime.skips`) becomes ``_errors`` rows here, beside the rows.
A landing ahead (:func:`land_ahead`) is this stage run before its binding exists, for the probe
that asked for it (:class:`~reclock.sources.base.LandFirst`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

from reclock.errors import ContractError, DefiniteSourceError, ErrorKind, TransientError
from reclock.persist.data_files import DataFile, discard_data_file
from reclock.persist.evolution import SchemaEvolutionError, refuse_new_fields
from reclock.runtime.ahead import Landing
from reclock.runtime.batch import Batch
from reclock.runtime.driver import Driver
from reclock.runtime.plan import appends_of, task_plan
from reclock.runtime.ranges import BatchRange
from reclock.runtime.reports import BatchFailed, BatchState, ms_since
from reclock.runtime.skips import skipped_rows
from reclock.runtime.task import BatchPlan, SplitResult
from reclock.sources.base import LandFirst, Split
from reclock.timeline.frontier import wall_clock_ms

__all__ = ["land", "land_ahead", "run_tasks"]


def land(driver: Driver, batch: Batch) -> Batch:
    """The batch with its ``results`` and its ``files`` per output, every one written, none committed."""
    plan, report = batch.plan, batch.report
    # The probe may have been long: a driver that lost its lease meanwhile writes no data file either.
    driver.fence()
    results = list(batch.landed) if batch.landed is not None else run_tasks(driver, plan, batch.splits)
    report.state, report.results = BatchState.SUCCEEDED, results
    report.phases["read"], clock = ms_since(batch.clock)
    if any(r.error for r in results):
        _discard(plan, [f for r in results for f in r.files])
        report.state = BatchState.FAILED
        report.duration_ms = wall_clock_ms() - report.started_ms
        failure = BatchFailed(report)
        report.error = str(failure)
        raise failure
    files = [f for r in results for f in r.files]
    if batch.skips:
        files += skipped_rows(plan, batch.skips)
    driver.on_step("written")
    by_output: dict[str, list[DataFile]] = {name: [] for name in driver.sinks}
    for f in files:
        by_output[f.output].append(f)
    try:
        refuse_new_fields(
            driver.name,
            batch.binding_ts,
            {n: (driver.layouts[n], fs) for n, fs in by_output.items() if n in driver.layouts},
        )
    except SchemaEvolutionError as exc:
        _discard(plan, files)
        report.state = BatchState.FAILED
        report.error = str(exc)
        raise
    held = {name: tuple(fs) for name, fs in by_output.items()}
    return replace(batch, results=tuple(results), files=held, clock=clock)


def run_tasks(driver: Driver, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
    """The data plane's results of ``splits``, in the order of the splits (a plane may return
    them as its tasks ran), so "first" in a failure and the order of status rows mean the source's."""
    results = driver.plane.run(plan, splits)
    position = {(s.partition, s.start): i for i, s in enumerate(splits)}
    return sorted(results, key=lambda r: position.get((r.split.partition, r.split.start), len(position)))


def land_ahead(driver: Driver, request: LandFirst) -> Landing:
    """Land ``request`` before its binding exists, and keep the landing durable (steps 1 and 2 of
    :mod:`reclock.runtime.ahead`): the batch binding ``request.upper`` at a reserved time.

    Called in a probe, when every binding is in every output: the batch it lands is the next
    one, from the resume upper, with the sinks as they are now. A split that fails discards
    every file and raises (a :class:`~reclock.errors.TransientError` when it may succeed later):
    the probe is not answered, and the source gives its request up at the next.
    """
    bindings = driver.remap.bindings
    if driver.pending:
        raise ContractError("a source may land ahead only when every binding is in every output")
    into_ts = max(driver.now(), bindings.upper)
    bound = copy.deepcopy(bindings)
    bound.mint(into_ts, request.upper)
    splits = list(request.splits)
    appends = appends_of(driver, splits)
    moved = BatchRange(into_ts, bindings.frontier, request.upper).moved
    plan = task_plan(driver, bound, driver.resume_upper, moved, splits, appends)
    driver.fence()
    done = run_tasks(driver, plan, splits)
    failed = next((r for r in done if r.error), None)
    if failed is not None:
        _discard(plan, [f for r in done for f in r.files])
        kind = TransientError if failed.error_kind is ErrorKind.TRANSIENT else DefiniteSourceError
        raise kind(f"a batch landed ahead of its binding failed: {failed.error}")
    driver.on_step("landed-ahead")
    landing = Landing.of(into_ts, request.upper, appends, done)
    driver.landings.keep(landing)
    driver.on_step("kept-ahead")
    return landing


def _discard(plan: BatchPlan, files: Sequence[DataFile]) -> None:
    """Remove files no commit will hold (they belong to no table yet: nothing else sees them)."""
    for f in files:
        discard_data_file(plan.roots[f.output], f, plan.store)

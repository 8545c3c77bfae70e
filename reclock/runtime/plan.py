"""The plan stage: step 3 of a batch, from what is durable to a :class:`~reclock.runtime.batch.Batch`.

Every output's upper says what it holds; the batch starts at the slowest
(:func:`~reclock.runtime.ranges.plan_batch`: ``lower = R(resume upper - 1)``, the pending bindings
that fit in ``max_batch``, up to ``binding_ts``, its id). Before that, outputs the source gained
are born (:mod:`reclock.runtime.births`). The batch's splits are the source's over
``[lower, upper)`` less the ranges recorded as skipped at its bindings, then the ranges redriven
at them (:mod:`reclock.runtime.redrives`); a batch whose records were landed ahead of its binding
(:mod:`reclock.runtime.ahead`) carries that landing's results instead of tasks to run. The tasks'
:class:`~reclock.runtime.task.BatchPlan` is the same for a batch and for its landing ahead
(:func:`task_plan`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from reclock.envelope import APPEND
from reclock.errors import ContractError
from reclock.runtime.ahead import Landing
from reclock.runtime.batch import Batch
from reclock.runtime.births import born_outputs
from reclock.runtime.driver import Driver
from reclock.runtime.logs import BATCH_ID
from reclock.runtime.ranges import BatchRange, plan_batch, without_skips
from reclock.runtime.redrives import redrive_splits
from reclock.runtime.reports import BatchReport, BatchState, ms_since
from reclock.runtime.task import BatchPlan
from reclock.sources.base import AsksFirst, DistinctInserts, Split
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import IntoTime, Partition, wall_clock_ms

__all__ = ["appends_of", "plan", "task_plan"]


def plan(driver: Driver) -> Batch | None:
    """The next batch from the slowest output on, or ``None`` when every binding is in every output."""
    # Outputs the source gained are born before a batch reaches their binding.
    born_outputs(driver)
    clock = time.monotonic()
    bindings = driver.remap.bindings
    lo = driver.resume_upper
    batch = plan_batch(bindings, lo, driver.settings.max_batch)
    if batch is None:
        return None
    BATCH_ID.set(batch.binding_ts)
    moved = batch.moved
    skips = tuple(skip for skip in driver.remap.skips if lo <= skip.binding_ts <= batch.binding_ts)
    splits = without_skips(driver.source.splits(batch.lower, batch.upper), list(skips)) if moved else []
    # Records from _errors read again, in the batch of the binding they were redriven at.
    splits += redrive_splits(
        driver.source, bindings, driver.remap.redrives, list(skips), between=(lo, batch.binding_ts)
    )
    ahead = _landed_ahead(driver, batch)  # landed before its binding: its files are the batch's
    landed = tuple(ahead.results(splits)) if ahead is not None else None
    tasks = task_plan(driver, bindings, lo, moved, splits, ahead.appends if ahead is not None else None)
    report = BatchReport(
        batch.binding_ts,
        BatchState.IN_PROGRESS,
        skips=list(skips),
        lower=batch.lower,
        upper=batch.upper,
        started_ms=wall_clock_ms(),
    )
    report.phases["plan"], clock = ms_since(clock)
    return Batch(batch, lo, skips, tuple(splits), tasks, report, clock, landed=landed)


def task_plan(
    driver: Driver,
    bindings: Bindings,
    lo: IntoTime,
    moved: Sequence[Partition],
    splits: Sequence[Split],
    appends: frozenset[str] | None = None,
) -> BatchPlan:
    """The tasks' plan of a batch from ``lo`` over ``splits`` stamped by ``bindings``: the
    same for a batch and for its landing ahead (:mod:`reclock.runtime.ahead`)."""
    if appends is None:
        appends = appends_of(driver, splits)
    sinks = driver.sinks
    return BatchPlan(
        source=driver.source,
        stamper=bindings.stamper(after=lo - 1 if lo else None, partitions=moved),
        uppers={name: sink.upper for name, sink in sinks.items()},
        roots={name: str(sink.path if name in appends else sink.write_root) for name, sink in sinks.items()},
        schemas={name: sink.schema if name in appends else sink.write_schema for name, sink in sinks.items()},
        file_rows=driver.settings.file_rows,
        envelopes={o.name: (o.envelope, o.key) for o in driver.outputs.values() if o.envelope != APPEND},
        store=driver.lake.store,
        layouts=driver.layouts,
        added={name: sink.added for name, sink in sinks.items() if sink.added},
        routes=driver.routes,
        appends=appends,
    )


def appends_of(driver: Driver, splits: Sequence[Split]) -> frozenset[str]:
    """The MERGE outputs this batch appends to instead: those the source promises only
    inserts of distinct keys in ``splits`` (:class:`~reclock.sources.base.DistinctInserts`,
    a database's initial snapshot) whose tables hold no row yet; a MERGE of such a batch into
    such a table could only insert every record. Shaped outputs are never among them."""
    if not isinstance(driver.source, DistinctInserts):
        return frozenset()
    promised = driver.source.distinct_inserts(splits)
    return frozenset(
        name
        for name in promised
        if name in driver.sinks and name not in driver.routes and driver.sinks[name].can_append()
    )


def _landed_ahead(driver: Driver, batch: BatchRange) -> Landing | None:
    """The landing ahead if it is this batch's; one the batch would cover otherwise than whole
    breaks the planning's promise (the landing is minted alone, as the next binding)."""
    if not isinstance(driver.source, AsksFirst):
        return None
    ahead = driver.landings.pending(driver.resume_upper)
    if ahead is None or ahead.into_ts > batch.binding_ts:
        return None
    if ahead.into_ts != batch.binding_ts or ahead.upper != batch.upper:
        raise ContractError(f"batch {batch.binding_ts} covers the landing ahead at {ahead.into_ts} with other bindings")
    return ahead

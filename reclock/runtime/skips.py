"""Skips: the ranges of a batch given up after its retries, recorded durably and landed as errors.

When a batch keeps failing on bad data and the pipeline does not stop on errors
(:mod:`reclock.runtime.failures`), the loop records its failed splits as skipped at the batch's
binding (:func:`record_skips`), before anything of it commits. Every later attempt of that batch
plans its splits without those ranges (:func:`~reclock.runtime.ranges.without_skips`) and lands
one ``_errors`` row per range (:func:`skipped_rows`), so the records are counted exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from reclock.persist.data_files import DataFile, write_data_file
from reclock.persist.remap import REREAD_START, Skip
from reclock.runtime.driver import Driver
from reclock.runtime.reports import BatchReport
from reclock.runtime.rows import output_rows
from reclock.runtime.task import BatchPlan
from reclock.sources.base import ERRORS, error_batch
from reclock.timeline.frontier import encode_partition

__all__ = ["record_skips", "skipped_rows"]

log = logging.getLogger("reclock.pipeline")


def skipped_rows(plan: BatchPlan, skips: Sequence[Skip]) -> list[DataFile]:
    """One ``_errors`` row per skipped range, stamped like the range's first record (none for
    the offsets before a re-read's start: they were never the re-read's to load)."""
    skips = [s for s in skips if s.reason != REREAD_START]
    if not skips:
        return []
    partitions = pa.array([encode_partition(s.partition) for s in skips], pa.string())
    starts = pa.array([s.start for s in skips], pa.int64())
    into = plan.stamper.into_times(partitions, starts)
    keep = into >= plan.uppers[ERRORS]
    if not keep.any():
        return []
    messages = [
        f"offsets [{s.start}, {s.end}) of partition {encode_partition(s.partition)} skipped: {s.reason}" for s in skips
    ]
    reasons = error_batch(partitions, starts, ["skipped"] * len(skips), messages, [None] * len(skips))
    table = output_rows(reasons, into, plan.schemas[ERRORS]).filter(pa.array(keep))
    return [write_data_file(plan.roots[ERRORS], ERRORS, table, plan.store)]


def record_skips(driver: Driver, report: BatchReport, attempts: int) -> None:
    """Give up the failed splits of a batch, durably, before anything of it commits."""
    assert report.binding_ts is not None, "only a planned batch fails"
    skips = [
        Skip(
            report.binding_ts, r.split.partition, r.split.start, r.split.end, f"{r.error} (failed {attempts} attempts)"
        )
        for r in report.results
        if r.error
    ]
    driver.fence()
    recorded = driver.remap.record_skips(skips)
    log.warning(
        "pipeline %s: skipped %d ranges of batch %s after %d attempts",
        driver.name,
        len(recorded),
        report.binding_ts,
        attempts,
    )

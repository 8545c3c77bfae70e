"""Health of a running pipeline, as the job reports it in ``status.json`` and ``reclock status``.

``stalled`` is a transient fault (broker down, commit conflict, a full disk): retried with
backoff, shown with the error and a hint, and never mistaken for progress. ``degraded`` is a job
that commits, but whose last batch sent every record it read to ``_errors`` (a transform that
fails on every row, a format that does not match): nothing is lost, the records wait in
``_errors`` for a fixed definition and ``reclock redrive``, but nothing lands either, and
``running`` would hide that. ``failed`` is definite: retrying cannot help. A reader also derives
``dead`` (no job holds the lock) in :func:`reclock.job.status.read_status`; the job itself never
reports it.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from reclock.persist.store import LakePath, Store
from reclock.runtime.reports import BatchReport
from reclock.sources.base import ERRORS

__all__ = ["Health", "after_batch"]

log = logging.getLogger("reclock.pipeline")


class Health(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DEGRADED = "degraded"
    STOPPED = "stopped"
    STALLED = "stalled"
    FAILED = "failed"


def after_batch(
    name: str, report: BatchReport, errors_root: LakePath, store: Store, now: tuple[Health, str | None]
) -> tuple[Health, str | None]:
    """The health and error a committed batch leaves: ``degraded``, naming the first record's
    error, if records were read and every one went to ``_errors``; else ``running``. A step that
    read nothing keeps ``now`` if it is ``degraded``: only a batch that lands rows shows the fix worked."""
    rejected = [f for r in report.results for f in r.files if f.output == ERRORS]  # not skipped ranges
    count = sum(f.num_records for f in rejected)
    landed = any(n for output, n in report.rows.items() if output != ERRORS)
    if not count and not landed and now[0] is Health.DEGRADED:
        return now
    if not count or landed:
        return Health.RUNNING, None
    try:  # observability: one row of one file, and a lake that refuses it must not fail the batch
        first = store.read_parquet([str(errors_root / rejected[0].path)], columns=["message"])["message"][0]
        example = f"; the first: {first.as_py()}"
    except (OSError, IndexError, KeyError) as exc:
        log.debug("pipeline %s: could not read an _errors message: %s", name, exc)
        example = ""
    error = (
        f"every record of batch {report.binding_ts} ({count:,}) went to _errors{example}. Nothing is lost: "
        f"see reclock errors {name}, fix the definition (reclock create --replace), then reclock redrive {name}"
    )
    log.warning("pipeline %s: degraded: %s", name, error)
    return Health.DEGRADED, error

"""What a batch did: its state, rows, splits, skips and where its time went.

The pipeline fills a :class:`BatchReport` per step and hands it to observers (the job's status
tables, metrics and progress line); :class:`BatchFailed` carries the report of a batch whose
splits failed, so retries and skips see exactly which ranges.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import StrEnum

from reclock.errors import ReclockError
from reclock.persist.remap import Skip
from reclock.runtime.maintenance import MaintenanceReport
from reclock.runtime.task import SplitResult
from reclock.timeline.frontier import Frontier, IntoTime

__all__ = ["FILTERED", "BatchFailed", "BatchReport", "BatchState", "filtered_json", "ms_since"]

#: Custom metadata of every output's commit of a batch: the rows its transforms filtered out
#: (``WHERE``), per source partition, as JSON. The same on every attempt of the batch, so the
#: status row of a batch whose job was killed is rebuilt with it (:mod:`reclock.job.status_restore`).
FILTERED = "reclock.filtered"


class BatchState(StrEnum):
    IN_PROGRESS = "In Progress"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    NO_DATA = "No Data"


@dataclass
class BatchReport:
    """What one step did; ``binding_ts`` (the batch id) is ``None`` when there was nothing to do."""

    binding_ts: IntoTime | None = None
    state: BatchState = BatchState.NO_DATA
    rows: dict[str, int] = field(default_factory=dict)
    results: list[SplitResult] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    lower: Frontier = field(default_factory=Frontier)
    upper: Frontier = field(default_factory=Frontier)
    started_ms: int = 0
    duration_ms: int = 0
    error: str | None = None
    maintenance: MaintenanceReport | None = None  # when this step also maintained the tables
    #: Milliseconds per phase, like Spark's ``durationMs``: ``probe`` and ``mint`` (absent when
    #: the step replayed bindings minted before), ``plan``, ``read`` (reading, decoding and
    #: writing files: the data plane) and ``commit`` (every output, then the source).
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        return self.binding_ts is None


class BatchFailed(ReclockError):
    """Some splits of a batch failed; nothing of the batch was committed."""

    def __init__(self, report: BatchReport) -> None:
        assert report.binding_ts is not None, "only a planned batch can fail"
        self.report = report
        self.binding_ts: IntoTime = report.binding_ts
        failed = [r for r in report.results if r.error]
        self.kinds = {r.error_kind for r in failed if r.error_kind is not None}  # a task's error has a kind
        first = failed[0]
        super().__init__(
            f"batch {report.binding_ts}: {len(failed)} of {len(report.results)} splits failed; first: partition "
            f"{first.partition} offsets [{first.split.start}, {first.split.end}): {first.error}"
        )


def filtered_json(results: list[SplitResult]) -> str:
    """:data:`FILTERED` of a batch: ``{partition: rows filtered}`` as JSON, partitions sorted."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.partition] = counts.get(r.partition, 0) + r.filtered
    return json.dumps(dict(sorted(counts.items())), separators=(",", ":"))


def ms_since(clock: float) -> tuple[int, float]:
    """Whole milliseconds since ``clock`` (a ``time.monotonic()``), and the clock now."""
    now = time.monotonic()
    return int((now - clock) * 1000), now

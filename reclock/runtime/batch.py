"""The batch as a value: what one binding's work is, passed through the stages of the design's flow.

One batch goes plan → land → commit → resume (:mod:`reclock.runtime.plan`,
:mod:`reclock.runtime.land`, :mod:`reclock.runtime.commit`, :mod:`reclock.runtime.resume`), as
Materialize's ``create_raw_source`` is reader → remap → reclock: each stage takes a :class:`Batch`
and returns one, a new value with what it added, and owns nothing between batches. A stage that
fails raises; what it had written is its to undo (uncommitted files), so a retry of the batch is
the same batch again, planned afresh from what is durable.

The :class:`~reclock.runtime.reports.BatchReport` a batch carries is the observers' view of it (the
job's status rows, its metrics), handed to them as soon as the batch is planned and filled in by
the stages as they go: the one mutable part, and never read back by a stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from reclock.persist.data_files import DataFile
from reclock.persist.remap import Skip
from reclock.runtime.ranges import BatchRange
from reclock.runtime.reports import BatchReport
from reclock.runtime.task import BatchPlan, SplitResult
from reclock.sources.base import Split
from reclock.timeline.frontier import IntoTime

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """One batch between two stages.

    Set by the plan stage: ``range`` (the bindings it covers up to ``range.binding_ts``, its id,
    and the source range ``[lower, upper)``), ``resume_upper`` (the slowest output's upper it
    was planned from: the rows each output already holds are dropped by the tasks), ``skips``
    (ranges recorded as skipped at its bindings), ``splits`` (the live ones, less the skipped
    ranges, then those redriven), ``plan`` (what every task gets), ``landed`` (the results of a
    landing ahead of its binding, :mod:`reclock.runtime.ahead`, which the land stage takes instead
    of running tasks) and ``report``. Set by the land stage: ``results`` (one per split) and
    ``files`` (per output of the pipeline, what its commit holds). ``clock`` is the
    ``time.monotonic()`` at which the batch's current phase began (the report's ``phases``).
    """

    range: BatchRange
    resume_upper: IntoTime
    skips: tuple[Skip, ...]
    splits: tuple[Split, ...]
    plan: BatchPlan
    report: BatchReport
    clock: float
    landed: tuple[SplitResult, ...] | None = None
    results: tuple[SplitResult, ...] = ()
    files: Mapping[str, tuple[DataFile, ...]] = field(default_factory=dict)

    @property
    def binding_ts(self) -> IntoTime:
        """The batch's id: the last binding it covers, the label of every output's commit."""
        return self.range.binding_ts

"""What ``reclock start`` shows while a job runs: one snapshot per batch, drawn when it is true.

The job hands a :class:`JobProgress` to a :class:`ProgressView`: :class:`PlainLines` writes the
progress line (to a pipe or a file, one line a batch), the command line draws a live bar on a
terminal (:mod:`reclock.cli.progress`). Both show the same numbers.

*When* a snapshot is drawn matters for lag (:mod:`reclock.timeline.lag`). Right after a commit,
the last probe is the one the batch bound, so a batch that took all it saw reads lag 0 however
much arrived while it ran (the demo showed 0 on every line while ``reclock offsets`` showed
thousands). :class:`Tracker` therefore draws a batch's snapshot after the *next* probe, which the
job makes at once when there is more to do: the line then shows what is waiting now. A batch that
no probe follows soon (a failed attempt, a pending binding, the last batch) is drawn at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, TextIO, runtime_checkable

from reclock.job.status import Status
from reclock.runtime.health import Health
from reclock.runtime.pipeline import BatchReport, BatchState, Pipeline

__all__ = ["JobProgress", "PlainLines", "ProgressView", "Tracker", "progress_line"]


@dataclass(frozen=True)
class JobProgress:
    """One snapshot of a running job."""

    pipeline: str
    health: str
    batches: int  # committed in this run
    rows: int  # landed in this run, over all outputs
    elapsed_s: float
    lag: int | None  # offsets the source has that are not yet in every output (None before a probe)
    loaded: int  # offsets every output took in this run
    into_ms: int  # the newest into time every output holds (0: none yet)

    @property
    def backlog(self) -> int | None:
        """What this run has to load to catch up, as far as the source is known: ``loaded + lag``."""
        return None if self.lag is None else self.loaded + self.lag


@runtime_checkable
class ProgressView(Protocol):
    def show(self, progress: JobProgress) -> None: ...

    def close(self) -> None: ...


def progress_line(p: JobProgress) -> str:
    """The plain progress line (``docs/operations.md`` shows it)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(p.into_ms / 1000)) if p.into_ms > 0 else "-"
    lag = p.lag if p.lag is not None else "-"
    return (
        f"{p.pipeline}  {p.health:<8} batches {p.batches:>5}  rows {p.rows:>12,}"
        f"  {p.rows / max(p.elapsed_s, 1e-9):>10,.0f} rows/s  lag {lag:>10}  into {stamp}"
    )


class PlainLines:
    """One progress line a snapshot; on a terminal, the line is redrawn in place."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._drawn = False

    def show(self, progress: JobProgress) -> None:
        if self.out.isatty():
            self.out.write("\r" + progress_line(progress))
        else:
            self.out.write(progress_line(progress) + "\n")
        self.out.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn and self.out.isatty():  # end the line drawn in place
            self.out.write("\n")
            self.out.flush()


class Tracker:
    """Decides when a snapshot is drawn (see the module docstring) and builds it."""

    def __init__(self, view: ProgressView, pipeline: Pipeline, status: Status) -> None:
        self.view = view
        self.pipeline = pipeline
        self.status = status  # the job's counts, updated before each batch is heard of
        self.started = time.monotonic()
        self._first = self._offsets()
        self._loaded = 0
        self._health = pipeline.health
        self._due = False

    def batch(self, report: BatchReport) -> None:
        """A batch ended (or an idle step, or a failed attempt)."""
        changed = self.pipeline.health is not self._health
        self._health = self.pipeline.health
        if report.idle and not changed:
            return  # not a line per idle wait
        self._due = True
        if report.state is not BatchState.SUCCEEDED or self.pipeline.health is not Health.RUNNING:
            self._draw()
        elif self.pipeline.pending or self.pipeline.finished:
            self._draw()  # no probe comes before the next batch

    def probed(self) -> None:
        """The job probed the source: a batch waiting to be drawn is drawn with the fresh lag."""
        if self._due:
            self._draw()

    def close(self) -> None:
        if self._due:
            self._draw()
        self.view.close()

    def _offsets(self) -> int | None:
        resume = self.pipeline.resume_frontier()
        return None if resume.is_closed else sum(o for _, o in resume.items())

    def _draw(self) -> None:
        self._due = False
        now = self._offsets()
        if now is not None and self._first is not None:  # a closed frontier (finished) adds no offsets
            self._loaded = now - self._first
        p = self.pipeline
        self.view.show(
            JobProgress(
                pipeline=p.name,
                health=p.health.value,
                batches=self.status.batches,
                rows=sum(self.status.rows.values()),
                elapsed_s=time.monotonic() - self.started,
                lag=p.lag,
                loaded=self._loaded,
                into_ms=p.resume_upper - 1,
            )
        )

"""Progress of long work on the command line: a live bar on a terminal, plain lines in a pipe.

``reclock start`` (a backlog, or the whole snapshot of a bounded source), ``optimize``, ``vacuum``
and ``redrive`` report how far they are. On a terminal, `rich <https://rich.readthedocs.io>`_
draws a bar with the counts, the rate and an ETA, redrawn in place; anywhere else (a pipe, a file,
a log collector) the same counts are plain lines, one per step (at most one a second for many
small steps, such as records), so a log holds no escape codes and no carriage returns.
"""

from __future__ import annotations

import io
import os
import time
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from reclock.job.progress import JobProgress, PlainLines, ProgressView

__all__ = ["Steps", "job_view"]


def job_view(out: TextIO) -> ProgressView:
    """How ``reclock start`` shows its job: the bar on a terminal, the progress line elsewhere."""
    return _JobBar(out) if out.isatty() else PlainLines(out)


class _JobBar:
    """The job's bar: offsets loaded this run of ``loaded + lag`` (the backlog as far as the source
    is known, which grows while it produces), rows, rows/s and lag, and the ETA rich estimates
    from the recent rate."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def show(self, p: JobProgress) -> None:
        if self._progress is None:
            self._progress = _bar(self.out, "offsets")
            self._progress.start()
            self._task = self._progress.add_task(p.pipeline, total=p.backlog, note="")
        assert self._task is not None
        rate = p.rows / max(p.elapsed_s, 1e-9)
        lag = "-" if p.lag is None else f"{p.lag:,}"
        note = f"{p.health}  batches {p.batches:,}  rows {p.rows:,}  {rate:,.0f} rows/s  lag {lag}"  # as the line
        self._progress.update(self._task, completed=p.loaded, total=p.backlog, note=note)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class Steps:
    """Counts of a command's steps (tables, records): ``update(done, total)`` as each one ends."""

    def __init__(self, out: TextIO, what: str, unit: str, *, every_s: float = 0.0) -> None:
        """``every_s``: in plain lines, at most one line this often (the last step always has one)."""
        self.out = out
        self.what = what
        self.unit = unit
        self.every_s = every_s
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._printed = 0.0

    def __enter__(self) -> Steps:
        if self.out.isatty():
            self._progress = _bar(self.out, self.unit)
            self._progress.start()
            self._task = self._progress.add_task(self.what, total=None, note="")
        return self

    def update(self, done: int, total: int, note: str = "") -> None:
        if self._progress is not None:
            assert self._task is not None
            self._progress.update(self._task, completed=done, total=total, note=note)
            return
        now = time.monotonic()
        if done == total or now - self._printed >= self.every_s:
            self._printed = now
            self.out.write(f"{self.what}: {done:,}/{total:,} {self.unit}{f' ({note})' if note else ''}\n")
            self.out.flush()

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def _width(out: TextIO) -> int | None:
    """The columns of ``out``'s own terminal (rich asks the process's stdin and stdout, which need not be it)."""
    try:
        return os.get_terminal_size(out.fileno()).columns or None
    except (OSError, ValueError, io.UnsupportedOperation):
        return None


def _bar(out: TextIO, unit: str) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}"),
        console=Console(file=out, force_terminal=True, width=_width(out)),
        refresh_per_second=4,
    )

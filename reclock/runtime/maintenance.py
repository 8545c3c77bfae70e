"""Maintenance of one pipeline's tables, so a batch on day 100 costs what it cost on day 1.

What grows with a pipeline's age, and what bounds it (measurements in
``docs/design/20261123_maintenance_bounds_the_lake.md``):

* the remap table gains a file and a binding per batch: it is rewritten as one file with every
  binding older than the history window merged into one (:meth:`RemapTable.compact`);
* each output gains a small file per batch and a commit per batch: small files are compacted
  (``optimize``), files no version inside the history window needs are deleted (``vacuum``), and
  the log and checkpoint tombstones expire after the same window.

The *history window* (``history_minutes``) is how far back a reader can go: an as-of read of an
append output is exact at every time whatever the maintenance (its rows keep their ``_into_ts``),
one of an upsert output needs the table's old log and files and is exact inside the window;
``reclock files`` reports a file's into time exactly inside the window, and outside it as the
remap's since. The window is not free, and it is why the default is 0: on a local disk delta-rs
lists the whole ``_delta_log`` folder in every commit, about 17 µs per entry (deltalake 1.6.6), so
each retained commit makes every later commit slower; a window holds ``minutes x commits per
minute`` entries per table, and the cost of a batch is flat in age but grows with the window.

The job runs :func:`maintain_tables` itself every ``every`` batches, in its batch loop, between one
batch's commits and the next batch's mint, so it never races its own commits; ``reclock optimize``
and ``reclock vacuum`` run it by hand on a stopped pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from reclock.persist import maintenance as tables
from reclock.persist.remap import RemapTable
from reclock.persist.store import LakePath
from reclock.runtime.settings import Maintenance
from reclock.timeline.frontier import IntoTime

__all__ = ["MaintenanceReport", "maintain_tables"]

_MINUTE_MS = 60_000


@dataclass
class MaintenanceReport:
    """What one maintenance run did, per table (``remap`` and each output)."""

    since: IntoTime = 0  # the remap table's since afterwards: bindings at or below it are merged
    optimized: dict[str, int] = field(default_factory=dict)  # files merged away
    vacuumed: dict[str, int] = field(default_factory=dict)  # files deleted
    duration_ms: int = 0


def maintain_tables(
    remap: RemapTable,
    outputs: Mapping[str, LakePath],
    resume_upper: IntoTime,
    now_ms: int,
    policy: Maintenance,
    *,
    optimize: bool = True,
    vacuum: bool = True,
    fence: Callable[[], None] = lambda: None,
    on_table: Callable[[str, int, int], None] | None = None,
) -> MaintenanceReport:
    """Compact the remap table and ``optimize``, then ``vacuum``, every output; one pass.

    ``resume_upper`` is the least upper of ``outputs``: the remap table is compacted strictly below
    it, so the next batch (which starts there) stamps exactly as before. The tables are in the
    remap table's store (the lake's). Each step is its own
    commit and safe to interrupt at any point: a crash leaves either the old or the new state of
    a table, never a mixture, and the next run picks up from there. ``fence`` is called before
    each table's turn (the job's lease check): a vacuum by a driver that lost the pipeline could
    delete the files its successor wrote and has not committed yet. ``on_table(name, done, total)``
    hears of each table once its turn is over (``reclock optimize`` draws it as progress).
    """
    started = time.monotonic()
    report = MaintenanceReport()
    minutes = policy.history_minutes
    if optimize and remap.bindings.upper:
        fence()
        since = max(0, min(resume_upper - 1, now_ms - minutes * _MINUTE_MS))
        if remap.files > 1 or since > remap.bindings.since:
            remap.compact(since)
    report.since = remap.bindings.since
    paths = {"remap": remap.path, **outputs}
    for done, (name, path) in enumerate(paths.items(), 1):
        fence()
        table = remap.store.open_table(path)
        tables.set_retention(table, minutes)
        if optimize and name != "remap":
            report.optimized[name] = tables.optimize(table, policy.target_file_mb << 20)
        if vacuum:
            report.vacuumed[name] = tables.vacuum(table, minutes)
        if optimize:
            table.update_incremental()
            table.create_checkpoint()
        if on_table is not None:
            on_table(name, done, len(paths))
    remap.sync()  # the passes above committed to the remap table too: the next mint compares against them
    report.duration_ms = int((time.monotonic() - started) * 1000)
    return report

"""The probe and the cap: which files exist now, at which upper, and which the next batch binds.

Run on the driver before each batch. A file is the partition ``(relative_path, generation)``; its
**upper** is its size in bytes (CSV, JSON lines) or its row count from the footer (Parquet, no
data read), so a file is always bound *whole*. A file with upper 0 (empty) never shows in a
frontier. A Parquet file whose footer cannot be read is listed with upper 1, so that it reaches
the read and fails there, visibly.

Invariants the pipeline relies on:

* The probe never goes below the bound frontier: the older generations of a dropped file stay in
  it (at the file's upper), and within a process a probe never goes below the previous one, so a
  file that is deleted, shrinks or is dropped keeps its partition at its old offset.
* The cap binds only *new* files (listed now in their current generation, never bound), whole,
  oldest first in discovery order (modification time, then relative path, then generation).
* A file the cap sees bound in its current generation is retired: no probe examines it again
  (:mod:`~reclock.sources.files.discovery`) unless a drop gives it a new generation. Its partition stays
  in the probe at the upper last seen.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa

from reclock.sources.files.discovery import Discovery, Poll
from reclock.sources.files.listing import Listed, absolute, unpack
from reclock.sources.files.parquet import footer_rows
from reclock.sources.files.store import FileStore
from reclock.timeline.frontier import Frontier, Partition

__all__ = ["Probe", "settling"]

#: Upper of a Parquet file whose footer cannot be read: it binds, and its read raises.
_UNREADABLE_PARQUET_UPPER = 1

log = logging.getLogger(__name__)


def settling(f: Listed, now_ms: int, settle_seconds: float) -> bool:
    """Whether ``f`` was modified less than ``settle_seconds`` ago: it may still be being written."""
    return settle_seconds > 0 and now_ms - f.mtime_ns / 1_000_000 < settle_seconds * 1000


class Probe:
    """What the driver remembers between probes of one source; never pickled to a task.

    Incremental (see :mod:`~reclock.sources.files.discovery`): a probe examines only the files not yet
    bound, and a file the cap sees bound in its current generation is retired from examination;
    the frontier of everything seen is kept, and rebuilt only when a probe changed it. So an idle
    probe's cost does not grow with the files already loaded.
    """

    def __init__(self, root: str, discovery: Discovery, max_files: int, store: FileStore | None = None) -> None:
        self._root = root
        self._store = store
        self._max_files = max_files
        self._discovery = discovery
        #: Discovery-order key of every partition the probe has seen, for :meth:`cap`.
        self._order: dict[Partition, tuple[int, str, int]] = {}
        #: Parquet row counts by ``(path, size, mtime_ns)``: a footer is read once per version.
        self._footers: dict[tuple[str, int, int], int | None] = {}
        #: Partitions already warned about for changing after they were bound.
        self._warned: set[Partition] = set()
        #: The frontier :meth:`upper` returns, as a dict: probes never go below it.
        self._high: dict[Partition, int] = {}
        #: ``self._high`` as a frontier, rebuilt only when a probe changed it.
        self._frontier = Frontier()
        #: ``{(relative_path, current generation): (upper, path)}`` of the files the last probe
        #: examined and found settled: the files :meth:`cap` may take.
        self._listed: dict[Partition, tuple[int, str]] = {}
        #: ``relative_path -> generation`` of the files retired from examination.
        self._retired: dict[str, int] = {}
        #: What the last poll cost: directories read and files examined (beyond a stat per directory).
        self.last_poll: Poll | None = None

    def upper(self, generations: dict[str, int], now_ms: int, settle_seconds: float) -> Frontier:
        """``{(relative_path, generation): upper}`` of every settled file seen, joined with every
        earlier probe (so it never goes below one).

        ``generations`` is the generations file as read now: a retired file whose generation
        moved on (a drop) is examined again. ``now_ms`` dates the directories read and decides
        ``settle_seconds``.
        """
        for relative, generation in generations.items():
            if self._retired.get(relative, generation) != generation:
                del self._retired[relative]
                self._discovery.revive(relative)
        # The window holds the files the last batch bound (retired by the next cap) and the next pick.
        poll = self.last_poll = self._discovery.poll(now_ms, 2 * self._max_files)
        for relative in poll.gone:
            self._retired.pop(relative, None)
        self._listed = {}
        changed = False
        for f in poll.listed:
            if settling(f, now_ms, settle_seconds):
                continue
            generation = generations.get(f.relative, 0)
            partition = (f.relative, generation)
            upper = f.size if f.format != "parquet" else self.parquet_upper(f)
            if not upper:
                self._discovery.empty(f.path)
            self._listed[partition] = (upper, f.path)
            self._order[partition] = (f.mtime_ns, f.relative, generation)
            if upper > self._high.get(partition, 0):
                self._high[partition] = upper
                changed = True
            for old in range(generation):  # dropped generations: still complete where they were bound
                if upper and (f.relative, old) not in self._high:
                    self._high[(f.relative, old)] = upper
                    changed = True
        if changed:
            self._frontier = Frontier(self._high)
        return self._frontier

    def cap(self, lower: Frontier, upper: Frontier, max_files: int) -> Frontier:
        """Up to ``max_files`` new files of the last probe, oldest first, bound whole.

        A file is *new* when the last probe listed it in its current generation and ``lower`` has
        it at offset 0. A file ``lower`` already has is bound: it is retired from examination. If
        it grew since it was bound it changed after it was bound: it is not taken, and a warning
        is logged once.
        """
        fresh: list[Partition] = []
        for partition, (listed, path) in list(self._listed.items()):
            start = lower.offset(partition)
            if start == 0:
                if upper.offset(partition) > 0:
                    fresh.append(partition)
                continue
            relative, generation = unpack(partition)
            self._retired[relative] = generation
            self._discovery.retire(relative, path)
            del self._listed[partition]
            if start < min(upper.offset(partition), listed) and partition not in self._warned:
                self._warned.add(partition)
                log.warning(
                    "file %s changed after it was bound (bound up to %d, now %d); it is not read again unless dropped",
                    partition,
                    start,
                    listed,
                )
        if not fresh:
            return lower
        chosen = sorted(fresh, key=self.sort_key)[:max_files]
        return lower.join(Frontier({p: min(upper.offset(p), self._listed[p][0]) for p in chosen}))

    def sort_key(self, partition: Partition) -> tuple[int, str, int]:
        """Discovery order of a partition: as last probed, else from the file as it is now."""
        key = self._order.get(partition)
        if key is not None:
            return key
        relative, generation = unpack(partition)
        try:
            mtime_ns = os.stat(absolute(self._root, relative)).st_mtime_ns
        except OSError:
            mtime_ns = 2**63 - 1
        return (mtime_ns, relative, generation)

    def parquet_upper(self, f: Listed, *, warn: bool = True) -> int:
        """Row count from the footer (cached per file version); 1 if the footer cannot be read.

        The probe warns about an unreadable footer once per file version; a listing for the CLI
        (``warn=False``) stays quiet: the file's read fails visibly when its batch runs.
        """
        if f.size == 0:
            return 0
        key = (f.path, f.size, f.mtime_ns)
        if key not in self._footers:
            try:
                self._footers[key] = footer_rows(f.path, self._store)
            except (OSError, ValueError, pa.ArrowException) as exc:
                if not warn:
                    return _UNREADABLE_PARQUET_UPPER  # not cached: the probe still warns once
                log.warning("cannot read the Parquet footer of %s (%s); it will fail when read", f.path, exc)
                self._footers[key] = None
        rows = self._footers[key]
        return _UNREADABLE_PARQUET_UPPER if rows is None else rows

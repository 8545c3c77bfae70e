"""The remap table: a pipeline's bindings, durable in Delta, appended by compare-and-append.

Each binding is one Delta commit of rows ``(into_ts, partition, offset, closed)``: one row per
partition whose upper moved, or a single row with a null partition when only time advanced
(``closed`` marks the binding of a finished source). The table is never rewritten, so replaying
the rows in ``into_ts`` order rebuilds exactly the :class:`~reclock.timeline.bindings.Bindings` every
writer saw.

*Compaction* (:meth:`RemapTable.compact`) rewrites the table as one file in which every binding at
or below a ``since`` is merged into one binding at ``since`` (its rows carry the note
``compacted``), as Materialize compacts its remap shard: reclocking commutes with compaction, and
``since`` stays below every output's upper, so no record that is still to be written can be
stamped differently, and start-up reads a bounded state instead of every binding since creation.

A *skip* is the other kind of row: ``(into_ts, partition, offset=end, skip_start=start, note)``
records that the range ``[start, end)`` of a partition, bound at or before ``into_ts``, was given
up after its batch failed ``max_retries`` times (``stop_on_error = false``). It is durable before
any output commits the batch, so a replay after a crash excludes the very same records and a
record can never end up both skipped and loaded.

A *redrive* row has the same shape, noted :data:`REDRIVE`: records ``[start, end)`` of a partition
that went to ``_errors`` land again, read from the source, in the batch of the binding ``into_ts``
(minted in the same commit, see :meth:`RemapTable.mint_with_skips`), into the outputs the note
names (all their routes when it names none). The request is durable before anything is read, so
every replay of that batch lands the same records (``reclock redrive``, :mod:`reclock.job.redrive`).

Compare-and-append: a writer commits on the snapshot its view was built from with
``max_commit_retries=0``, so the commit lands at exactly the next version or not at all (Delta's
put-if-absent of the log file is the atomic compare). A writer that loses re-reads the table,
adopts what won and mints only the remainder if its proposal still advances both the time and the
frontier (Materialize #12600: never rebind what is already bound).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction

from reclock.persist.data_files import write_data_file
from reclock.persist.faults import lake_io
from reclock.persist.post_commit import hooks_for_next_commit
from reclock.persist.read import read_table
from reclock.persist.store import LOCAL, LakePath, Store, StorePath
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import (
    Frontier,
    IntoTime,
    Offset,
    Partition,
    decode_partition,
    encode_partition,
    wall_clock_ms,
)

__all__ = ["COMPACTED", "REDRIVE", "REREAD_START", "USER_SKIP", "REMAP_SCHEMA", "Redrive", "RemapTable", "Skip"]

REMAP_SCHEMA = pa.schema(
    [
        pa.field("into_ts", pa.int64(), nullable=False),
        pa.field("partition", pa.string()),
        pa.field("offset", pa.int64()),
        pa.field("closed", pa.bool_(), nullable=False),
        pa.field("skip_start", pa.int64()),
        pa.field("note", pa.string()),
    ]
)


@dataclass(frozen=True)
class Skip:
    """Offsets ``[start, end)`` of ``partition`` given up in the batch labelled ``binding_ts``."""

    binding_ts: IntoTime
    partition: Partition
    start: Offset
    end: Offset
    reason: str


@dataclass(frozen=True)
class Redrive:
    """Records ``[start, end)`` of ``partition`` from ``_errors`` land again in the batch of the
    binding ``binding_ts``, into ``outputs`` (empty: every output their records route to)."""

    binding_ts: IntoTime
    partition: Partition
    start: Offset
    end: Offset
    outputs: tuple[str, ...] = ()


_APP_ID = "reclock/remap"

#: The note on the rows of the binding that merges every binding at or below the table's ``since``.
COMPACTED = "compacted"

#: How the note of a skip a user asked for begins (``reclock set-offsets``): minted with its own
#: binding, it never stands for the batch's failed ranges (see :meth:`RemapTable.record_skips`).
USER_SKIP = "set-offsets:"

#: The note of the skip that makes a re-read partition start where the user asked: those offsets
#: were never the re-read's to load, so no ``_errors`` row stands for them.
REREAD_START = f"{USER_SKIP} a re-read starts after these offsets"

#: How the note of a redrive row begins; the outputs it names follow, comma-separated.
REDRIVE = "redrive"


class RemapTable:
    """Owner of one pipeline's bindings: the synced view plus the Delta table behind it."""

    def __init__(self, path: LakePath, store: Store = LOCAL) -> None:
        self.path = path if isinstance(path, StorePath) else Path(path)
        self.store = store
        with lake_io("opening the remap table"):
            self._table = _open_or_create(self.path, store)
            self._bindings, self._skips, self._redrives = _replay(self._table, store)
        self._unsure = False

    @property
    def bindings(self) -> Bindings:
        """The view as of the last sync or mint; do not mint on it directly.

        After a storage fault during a write the view is re-read before it is used again: the
        commit may have landed before the fault (a failed checkpoint after it), and a view that
        missed a durable binding would stamp records differently from every later replay.
        """
        self._settle()
        return self._bindings

    @property
    def held_bindings(self) -> Bindings:
        """The view as last read or minted, *not* re-read after a fault: no I/O, ever.

        Exact for every binding an output already holds, since a binding reaches an output only
        from this view; what a failed write may have missed lies above every output's upper. So
        it answers what depends on held bindings only (where the source resumes, whether the
        pipeline finished) while the store is away, and must never stamp records (use
        :attr:`bindings`).
        """
        return self._bindings

    @property
    def skips(self) -> list[Skip]:
        """Every recorded skip, in binding order."""
        self._settle()
        return list(self._skips)

    @property
    def redrives(self) -> list[Redrive]:
        """Every redrive requested, in binding order."""
        self._settle()
        return list(self._redrives)

    @property
    def version(self) -> int:
        return self._table.version()

    def sync(self) -> Bindings:
        """Catch up with whatever other writers committed since this view was read."""
        with lake_io("reading the remap table"):
            self._table = self.store.open_table(self.path)
            self._bindings, self._skips, self._redrives = _replay(self._table, self.store)
        self._unsure = False
        return self._bindings

    def _settle(self) -> None:
        if self._unsure:
            self.sync()

    def mint(self, time: IntoTime, frontier: Frontier) -> bool:
        """Make binding ``(time, frontier)`` durable, unless the table already holds an equal or
        later binding, in which case adopt the table's bindings and return ``False``.

        Called by the one remap operator of a pipeline; a concurrent or restarted writer is
        handled, not assumed away.
        """
        return self.mint_with_skips(time, frontier, [])

    def mint_with_skips(
        self, time: IntoTime, frontier: Frontier, skips: list[Skip], redrives: list[Redrive] | None = None
    ) -> bool:
        """:meth:`mint`, with ``skips`` and ``redrives`` of that binding's batch in the same commit:
        a range a user skipped can never be bound without its skip, nor a redrive's binding
        without the records it lands, whatever crashes in between."""
        redrives = redrives or []
        while True:
            view = self.bindings
            if time < view.upper or not view.frontier.less_equal(frontier) or view.is_closed:
                return False
            rows = _binding_rows(time, view.frontier, frontier)
            if skips or redrives:
                rows = pa.concat_tables([rows, _skip_rows(skips), _redrive_rows(redrives)])
            self._unsure = True
            try:
                with lake_io(f"minting binding {time} in the remap table"):
                    self._append(rows, [Transaction(_APP_ID, time)])
            except CommitFailedError:
                self.sync()
                continue
            self._unsure = False
            view.mint(time, frontier)
            self._skips.extend(skips)
            self._redrives.extend(redrives)
            return True

    def record_skips(self, skips: list[Skip]) -> list[Skip]:
        """Make the skips of one batch durable, unless that batch already has skips recorded.

        Returns the skips now in force for the batch: ours, or the ones another writer (a run
        before a crash) recorded first, which win because outputs may already reflect them.
        """
        binding_ts = skips[0].binding_ts
        while True:
            self._settle()
            existing = [s for s in self._skips if s.binding_ts == binding_ts and not s.reason.startswith(USER_SKIP)]
            if existing:
                return existing
            rows = _skip_rows(skips)
            self._unsure = True
            try:
                with lake_io(f"recording skips of batch {binding_ts} in the remap table"):
                    self._append(rows, [])
            except CommitFailedError:
                self.sync()
                continue
            self._unsure = False
            self._skips.extend(skips)
            return list(skips)

    @property
    def files(self) -> int:
        """How many files the table's current snapshot has: what :meth:`compact` brings to one."""
        return len(self._table.file_uris())

    def compact(self, since: IntoTime) -> bool:
        """Rewrite the table as one file, with every binding at or below ``since`` merged into one.

        ``since`` must be below every output's upper (the caller's duty: the batch that
        follows re-stamps records from the resume upper on, which compaction leaves alone). The
        rewrite is one overwrite commit by compare-and-append, like a mint: if another writer
        committed meanwhile it fails, the view is re-read and ``False`` returned (try again at
        the next maintenance); nothing is half done. Skips are kept whatever their time.
        """
        view = self.bindings
        if since >= view.upper:
            raise ValueError(f"cannot compact the remap table to {since}: its upper is {view.upper}")
        times = view.times()
        below = bisect_right(times, since)
        since = max(times[below - 1] if below else 0, view.since)
        rows = _rows_of(view, since, self._skips, self._redrives)
        self._unsure = True
        try:
            with lake_io("compacting the remap table"):
                self._append(rows, [], mode="overwrite")
        except CommitFailedError:
            self.sync()
            return False
        self._unsure = False
        view.compact(since)
        return True

    def _append(self, rows: pa.Table, labels: list[Transaction], *, mode: str = "append") -> None:
        """Commit ``rows`` as one file at exactly the next version of the view's snapshot, or fail.

        ``max_commit_retries=0`` makes the commit land at the version after the one the view was
        built from, or raise :class:`CommitFailedError` (the compare). The snapshot then advances
        by exactly that one version, incrementally, so the next compare is against our own commit
        and never silently against another writer's, and a mint costs the same at any age.
        """
        version = self._table.version()
        data = write_data_file(self.path, "remap", rows, self.store)
        self._table.create_write_transaction(
            [AddAction(data.path, data.size, {}, wall_clock_ms(), True, data.stats)],
            mode=mode,
            schema=self._table.schema(),
            commit_properties=CommitProperties(max_commit_retries=0, app_transactions=labels),
            post_commithook_properties=hooks_for_next_commit(self._table),
        )
        self._table.load_as_version(version + 1)


def _open_or_create(path: LakePath, store: Store) -> DeltaTable:
    if store.is_table(path):
        return store.open_table(path)
    try:
        return store.create_table(path, REMAP_SCHEMA, name="reclock_remap")
    except Exception:
        if store.is_table(path):
            return store.open_table(path)
        raise


def _rows_of(bindings: Bindings, since: IntoTime, skips: list[Skip], redrives: list[Redrive]) -> pa.Table:
    """The rows of a compacted table: one binding at ``since`` with the whole frontier it had,
    noted :data:`COMPACTED`, then every later binding as it was minted, then every skip and
    every redrive."""
    parts = []
    previous = Frontier()
    for time, frontier in bindings:
        if time < since:
            continue
        merged = time == since and since > 0
        parts.append(
            _binding_rows(time, Frontier() if merged else previous, frontier, note=COMPACTED if merged else None)
        )
        previous = frontier
    parts += [_skip_rows(skips), _redrive_rows(redrives)]
    return pa.concat_tables(parts)


def _skip_rows(skips: list[Skip]) -> pa.Table:
    return pa.table(
        {
            "into_ts": [s.binding_ts for s in skips],
            "partition": [encode_partition(s.partition) for s in skips],
            "offset": [s.end for s in skips],
            "closed": [False] * len(skips),
            "skip_start": [s.start for s in skips],
            "note": [s.reason for s in skips],
        },
        schema=REMAP_SCHEMA,
    )


def _redrive_rows(redrives: list[Redrive]) -> pa.Table:
    return pa.table(
        {
            "into_ts": [r.binding_ts for r in redrives],
            "partition": [encode_partition(r.partition) for r in redrives],
            "offset": [r.end for r in redrives],
            "closed": [False] * len(redrives),
            "skip_start": [r.start for r in redrives],
            "note": [" ".join([REDRIVE, ",".join(r.outputs)]).strip() for r in redrives],
        },
        schema=REMAP_SCHEMA,
    )


def _redrive_of(time: IntoTime, partition: str, start: Offset, end: Offset, note: str) -> Redrive | None:
    """The redrive a row stands for, ``None`` if it is a skip."""
    kind, _, outputs = note.partition(" ")
    if kind != REDRIVE:
        return None
    return Redrive(time, decode_partition(partition), start, end, tuple(o for o in outputs.split(",") if o))


def _binding_rows(time: IntoTime, previous: Frontier, frontier: Frontier, *, note: str | None = None) -> pa.Table:
    rows: list[tuple[str | None, int | None, bool]]
    if frontier.is_closed:
        rows = [(None, None, True)]
    else:
        rows = [(encode_partition(p), o, False) for p, o in frontier.items() if o > previous.offset(p)]
        rows = rows or [(None, None, False)]
    partitions, offsets, closed = zip(*rows, strict=True)
    return pa.table(
        {
            "into_ts": [time] * len(rows),
            "partition": list(partitions),
            "offset": list(offsets),
            "closed": list(closed),
            "skip_start": [None] * len(rows),
            "note": [note] * len(rows),
        },
        schema=REMAP_SCHEMA,
    )


def _replay(table: DeltaTable, store: Store) -> tuple[Bindings, list[Skip], list[Redrive]]:
    data = read_table(table, store=store).sort_by("into_ts").to_pydict()
    bindings = Bindings()
    skips: list[Skip] = []
    redrives: list[Redrive] = []
    frontier: dict = {}
    pending: IntoTime | None = None
    since: IntoTime | None = None
    closed = False

    def flush() -> None:
        if pending is not None:
            bindings.mint(pending, Frontier.closed() if closed else Frontier(frontier))

    columns = ("into_ts", "partition", "offset", "closed", "skip_start", "note")
    for time, partition, offset, is_closed, skip_start, note in zip(*(data[c] for c in columns), strict=True):
        if skip_start is not None:
            redrive = _redrive_of(time, partition, skip_start, offset, note or "")
            if redrive is not None:
                redrives.append(redrive)
            else:
                skips.append(Skip(time, decode_partition(partition), skip_start, offset, note or ""))
            continue
        if time != pending:
            flush()
            pending = time
        if note == COMPACTED:
            since = time
        if is_closed:
            closed = True
        elif partition is not None:
            p = decode_partition(partition)
            frontier[p] = max(frontier.get(p, 0), offset)
    flush()
    if since is not None:
        bindings.compact(since)
    return bindings, skips, redrives

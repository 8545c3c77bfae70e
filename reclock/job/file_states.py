"""File states of a pipeline whose source's partitions are files, derived on demand from what is
durable in the lake.

A file partition ``(path, generation)`` of a :class:`~reclock.sources.base.FileStates` source (the
files source, or any plugin that declares it) is in exactly one state:

* **Loaded**: it is bound, and the source's outputs hold its binding: ``R(loaded_upper - 1)``
  reaches the upper it was bound at, where ``loaded_upper`` is the least upper over the source's
  own outputs. A file is always bound whole, so all its rows are in the output. ``_errors`` is
  left out on purpose: it commits right after the data outputs, so a crash between the two leaves
  rows visible whose batch some output lacks; the next start completes ``_errors`` (its bad lines)
  without touching the rows, and the file was Loaded all along.
* **Skipped**: a skip recorded in the remap table covers it: its batch failed ``max_retries``
  times with ``stop_on_error = false``. The skip is durable before the batch commits anything.
* **Unloaded**: listed now but not bound yet, or bound in a batch that its output does not hold
  yet (a batch in flight, or one cut short by a crash, which the next start completes).
* **Ignored**: listed, but the source never reads it (the files source's dangling links, links
  out of the directory, FIFOs, empty files: see :meth:`reclock.sources.files.FilesSource.listing`).

Why derived and not recorded: the remap table (bindings and skips) and the outputs' commit labels
are what exactly-once rests on, each written in the same durable step as the data it describes,
so states derived from them can never disagree with the outputs, whenever a job was killed. The
``files`` status table stays as a history log, caught up from this derivation when a job starts.

Reads are ordered so that a concurrent job can only make a state look *older*: the output's
label is read before the bindings, so a file is never called Loaded before its rows are
durable in the output.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeGuard

from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import RemapTable, Skip
from reclock.sources.base import FileStates, ListedFile, Source
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import IntoTime, Partition

__all__ = ["FileState", "FileStatus", "derive_file_states", "drop_refusal", "read_file_states"]


class FileState(StrEnum):
    UNLOADED = "Unloaded"
    LOADED = "Loaded"
    SKIPPED = "Skipped"
    IGNORED = "Ignored"


@dataclass(frozen=True)
class FileStatus:
    """One file partition's state.

    ``size`` is the upper it was bound at (bytes, rows for Parquet), or as listed now when it is
    not bound; ``into_ts`` is the time of the binding that bound it (its rows' ``_into_ts``),
    ``None`` when unbound, and the remap table's ``since`` for a file bound at or before it (a
    compaction merged those bindings; the rows keep their exact time); ``reason`` explains an
    Unloaded, Skipped or Ignored file, or notes that a bound one was dropped, changed or is no
    longer listed.
    """

    path: str
    generation: int
    state: FileState
    size: int
    into_ts: IntoTime | None
    reason: str | None


def derive_file_states(
    bindings: Bindings, skips: Iterable[Skip], loaded_upper: IntoTime, listing: Iterable[ListedFile] | None
) -> list[FileStatus]:
    """The state of every bound or listed file partition, newest first.

    ``bindings`` and ``skips`` are the remap table's, ``loaded_upper`` the least upper over the
    source's own outputs (``_errors`` left out), ``listing`` what the source lists now (``None``:
    unknown, so only bound partitions are reported). Newest first: unbound files (by path), then bound ones
    by binding time, latest first.
    """
    skipped: dict[Partition, list[str]] = {}
    for skip in skips:
        skipped.setdefault(skip.partition, []).append(skip.reason)
    listed = {(f.path, f.generation): f for f in listing or ()}
    bound = bindings.frontier
    loaded = bindings.source_upper_at(loaded_upper)
    bound_partitions = [p for p in bound.partitions() if _is_file(p)]
    latest: dict[str, int] = {}
    for path, generation in [*bound_partitions, *listed]:
        latest[path] = max(latest.get(path, 0), generation)
    out = []
    for partition in bound_partitions:
        path, generation = partition
        upper = bound.offset(partition)
        notes = []
        if partition in skipped:
            state = FileState.SKIPPED
            notes += skipped[partition]
        elif loaded.offset(partition) >= upper:
            state = FileState.LOADED
        else:
            state = FileState.UNLOADED
            notes.append("bound in a batch that is not in the output yet")
        entry = listed.get(partition)
        if latest[path] > generation:
            notes.append(f"dropped: generation {latest[path]} replaces it")
        elif listing is not None and entry is None:
            notes.append("no longer listed")
        elif entry is not None and entry.ignored:
            notes.append(f"now ignored: {entry.ignored}")
        elif entry is not None and entry.upper != upper:
            notes.append(f"changed after it was bound (upper now {entry.upper}): drop it to read it again")
        into_ts = bindings.reclock(partition, 0)
        out.append(FileStatus(path, generation, state, upper, into_ts, "; ".join(notes) or None))
    for (path, generation), entry in listed.items():
        if bound.offset((path, generation)):
            continue
        if entry.ignored:
            state, reason = FileState.IGNORED, entry.ignored
        elif entry.settling:
            state, reason = FileState.UNLOADED, "settling: modified less than settle_seconds ago"
        else:
            state, reason = FileState.UNLOADED, "not in a batch yet"
        out.append(FileStatus(path, generation, state, entry.upper, None, reason))
    out.sort(key=lambda s: (s.into_ts is not None, -(s.into_ts or 0), s.path, s.generation))
    return out


def read_file_states(lake: Lake, pipeline: str, source: Source) -> list[FileStatus]:
    """:func:`derive_file_states` over the lake's outputs and remap table and the source's listing.

    Read-only: a pipeline that never started has no tables, and none are created. ``source`` is
    a :class:`~reclock.sources.base.FileStates` source.
    """
    assert isinstance(source, FileStates), f"{source!r} keeps no file states"
    loaded_upper = min(_output_upper(lake, pipeline, o.name) for o in source.outputs())  # first: see the module doc
    path = lake.remap_path(pipeline)
    if lake.store.is_table(path):
        remap = RemapTable(path, lake.store)
        bindings, skips = remap.bindings, remap.skips
    else:
        bindings, skips = Bindings(), []
    return derive_file_states(bindings, skips, loaded_upper, source.listing())


def drop_refusal(states: Iterable[FileStatus], path: str, generation: int) -> str | None:
    """Why ``path``, now at ``generation``, cannot be dropped; ``None`` when it can.

    Only a Loaded or Skipped current generation can: dropping anything else would either do
    nothing (an unbound file is ingested anyway) or ingest a file twice behind the user's back
    (a file whose batch is still in flight, or one already dropped and not yet loaded again).
    """
    mine = {s.generation: s for s in states if s.path == path}
    current = mine.get(generation)
    if current is not None and current.state in (FileState.LOADED, FileState.SKIPPED):
        return None
    if not mine:
        return "is not a file it has seen"
    if current is None or (current.state is FileState.UNLOADED and current.into_ts is None and generation > 0):
        return f"is dropped already: generation {generation} is not loaded yet"
    if current.state is FileState.IGNORED:
        return f"is ignored ({current.reason})"
    if current.into_ts is not None:
        return "is in a batch that is not in the output yet; drop it once it is Loaded"
    return "has not loaded it yet"


def _is_file(partition: Partition) -> TypeGuard[tuple[str, int]]:
    return (
        isinstance(partition, tuple)
        and len(partition) == 2
        and isinstance(partition[0], str)
        and isinstance(partition[1], int)
    )


def _output_upper(lake: Lake, pipeline: str, output: str) -> IntoTime:
    """First into time ``output`` does not hold (0 when it has no table yet)."""
    path = lake.output_path(pipeline, output)
    return output_upper(path, sink_id(pipeline, output), lake.store) if lake.store.is_table(path) else 0

"""Status tables rebuilt from the lake when a job starts, so a SIGKILL leaves no hole in them.

The status tables are written from a buffer about once a second, off the batch's critical path
(:mod:`reclock.persist.status_tables`), so a job killed with SIGKILL loses the rows of its last second.
The lake itself lost nothing: the remap table and the outputs' labelled commits are the truth.
On start, the job appends what the history lacks, derived from that truth:

* ``files``: a Loaded or Skipped row for every file the lake says is in that state
  (:mod:`reclock.job.file_states`);
* ``batches``: one row per source partition for every recent batch that every output committed
  and the table has no finished row of (its label is the batch id, its offsets come from the
  bindings, the rows its transforms filtered out from its commits' metadata, which every
  attempt of a batch writes alike: :data:`~reclock.runtime.reports.FILTERED`). Rows, bytes and
  durations were only known to the dead process, so they stay empty: the row says the batch
  succeeded, which offsets it covered and what it filtered, never a number that was not
  measured. A batch some output lacks is left to its replay, whose row counts it whole.

``offsets`` needs no restoring: every successful batch writes it whole again.
"""

from __future__ import annotations

import json
import logging

from reclock.errors import describe
from reclock.job.file_states import FileState, derive_file_states
from reclock.persist.lake import Lake
from reclock.persist.status_tables import StatusTables, read_status_table
from reclock.runtime.pipeline import BatchState, Pipeline
from reclock.runtime.reports import FILTERED
from reclock.sources.base import FileStates
from reclock.timeline.frontier import encode_partition, wall_clock_ms

__all__ = ["restore_history"]

log = logging.getLogger("reclock.status")

#: How many of an output's latest commits a start-up looks at: far more than a second's batches.
_RECENT_COMMITS = 200


def restore_history(lake: Lake, tables: StatusTables, pipeline: Pipeline) -> None:
    """Append the ``files`` and ``batches`` rows a killed job never flushed (see the module doc).

    Observability only: if the history cannot be read (a status table damaged by hand, say), the
    job still starts and says so in its log, as the status writer does.
    """
    since = wall_clock_ms() - tables.retention_ms
    try:
        _restore_files(lake, tables, pipeline, since)
        _restore_batches(lake, tables, pipeline, since)
    except Exception as exc:
        log.warning("pipeline %s: could not restore the status history: %s", pipeline.name, describe(exc))


def _restore_files(lake: Lake, tables: StatusTables, pipeline: Pipeline, since: int) -> None:
    if not isinstance(pipeline.source, FileStates):
        return
    recorded = {
        (r["path"], r["generation"], r["state"])
        for r in read_status_table(lake, "files", pipeline.name).select(["path", "generation", "state"]).to_pylist()
    }
    loaded_upper = min(pipeline.sinks[o.name].upper for o in pipeline.source.outputs())
    derived = derive_file_states(pipeline.remap.bindings, pipeline.remap.skips, loaded_upper, None)
    tables.append(
        "files",
        [
            {
                "pipeline": pipeline.name,
                "path": s.path,
                "generation": s.generation,
                "size": s.size,
                "state": s.state.value,
                "batch_id": s.into_ts,
            }
            for s in reversed(derived)
            if s.state in (FileState.LOADED, FileState.SKIPPED)
            and (s.into_ts or 0) >= since
            and (s.path, s.generation, s.state.value) not in recorded
        ],
    )


def _restore_batches(lake: Lake, tables: StatusTables, pipeline: Pipeline, since: int) -> None:
    """One row per partition for each recently committed batch the table has no finished row of."""
    rows = read_status_table(lake, "batches", pipeline.name).select(["batch_id", "state"]).to_pylist()
    finished = {BatchState.SUCCEEDED.value, BatchState.NO_DATA.value}
    recorded = {r["batch_id"] for r in rows if r["state"] in finished}  # an In Progress row is not an end
    labels, from_the_start = _recent_labels(pipeline)
    bindings = pipeline.remap.bindings
    out = []
    for previous, label in zip([-1 if from_the_start else None, *labels], labels, strict=False):
        if label in recorded or label < since or previous is None or label >= pipeline.resume_upper:
            continue  # recorded already, expired, older than the commits looked at, or still to replay
        lower = bindings.source_upper_at(previous + 1)
        upper = bindings.source_upper_at(label + 1)
        if upper.is_closed:
            upper = bindings.source_upper_at(label)
        moved = {encode_partition(p): (lower.offset(p), o - 1) for p, o in upper.items() if o > lower.offset(p)}
        filtered = labels[label]
        common = {"pipeline": pipeline.name, "batch_id": label, "start_ms": None, "duration_ms": None}
        out += [
            {
                **common,
                "state": BatchState.SUCCEEDED.value,
                "partition": p,
                "earliest_offset": moved[p][0] if p in moved else None,
                "latest_offset": moved[p][1] if p in moved else None,
                "filtered": None if filtered is None else filtered.get(p, 0),
            }
            for p in sorted({*moved, *(filtered or {})})
        ] or [{**common, "state": BatchState.NO_DATA.value}]
    tables.append("batches", out)


def _recent_labels(pipeline: Pipeline) -> tuple[dict[int, dict[str, int] | None], bool]:
    """Batch ids of the recent commits of the output that holds the most (every batch commits
    each output once), oldest first, each with the rows its transforms filtered per partition
    (``None`` for a commit written before reclock recorded them), and whether they reach back to
    the table's first batch."""
    holder = max(pipeline.sinks.values(), key=lambda sink: sink.upper)
    history = holder.store.open_table(holder.path).history(limit=_RECENT_COMMITS)
    labels = {
        int(commit["reclock.into_ts"]): json.loads(commit[FILTERED]) if FILTERED in commit else None
        for commit in history
        if "reclock.into_ts" in commit
    }
    return dict(sorted(labels.items())), any(commit["version"] == 0 for commit in history)

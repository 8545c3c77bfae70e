"""Table maintenance: fewer, larger files and a bounded log, without changing what any read sees.

Every batch adds a small file to each output it touches and a commit to every output, so without
maintenance a table's live files, its log and its checkpoints grow with the pipeline's age, and
with them the cost of every commit and every reopen (delta-rs's conflict check, snapshot and
checkpoint are proportional to the live files). Three operations keep them bounded:

* :func:`optimize` rewrites small files into files of about ``target_size`` bytes: the same rows,
  a ``dataChange = false`` commit with no label, so labels, ``_into_ts`` and readers' answers stay;
* :func:`vacuum` deletes files no version inside the retention references (tombstones of
  rewritten files, and orphans of crashed tasks), but only files older than the retention, so a
  read that started inside it, or a task still writing, is never pulled from under;
* :func:`set_retention` makes the log and the tombstones in checkpoints expire after the same
  retention (``delta.logRetentionDuration``, ``delta.deletedFileRetentionDuration``), so delta-rs
  drops them at its checkpoints. ``delta.setTransactionRetentionDuration`` is never set: labels
  live in every checkpoint forever, so a late replay is always recognised.
"""

from __future__ import annotations

from pathlib import Path

from deltalake import CommitProperties, DeltaTable

from reclock.persist.faults import lake_io
from reclock.persist.post_commit import INTERVAL_PROPERTY, table_properties

__all__ = ["optimize", "retention_properties", "set_retention", "vacuum"]


def retention_properties(minutes: int) -> dict[str, str]:
    """The table properties that make the log and tombstones expire after ``minutes``."""
    interval = f"interval {minutes} minutes"
    return {"delta.logRetentionDuration": interval, "delta.deletedFileRetentionDuration": interval}


def set_retention(table: DeltaTable, minutes: int) -> bool:
    """Give ``table`` the retention properties, in one metadata commit; ``False`` if it had them.
    A local table without a checkpoint interval (made before reclock set one at creation) gets
    reclock's in the same commit (:mod:`reclock.persist.post_commit`); one it has is kept.

    A metadata commit conflicts with every concurrent commit, so it is written only when a
    property differs: once per table, and again only when the configured history changes.
    """
    current = table.metadata().configuration
    wanted = retention_properties(minutes)
    if INTERVAL_PROPERTY not in current:
        wanted.update(table_properties(table.table_uri))
    if all(current.get(k) == v for k, v in wanted.items()):
        return False
    with lake_io(f"setting the retention of {Path(table.table_uri).name}"):
        table.alter.set_table_properties(wanted, raise_if_not_exists=False)
    return True


def optimize(table: DeltaTable, target_size: int) -> int:
    """Compact the small files of ``table`` into files of about ``target_size`` bytes.

    Returns how many files were removed (0 when there was nothing to merge: no commit then).
    The commit is made on ``table``'s snapshot and retried by delta-rs only when the conflict
    checker allows (a blind append by someone else does not conflict with a compaction; a
    MERGE that read a file we removed does, and fails on its side, never silently).
    """
    if len(table.file_uris()) < 2:
        return 0
    with lake_io(f"optimizing {Path(table.table_uri).name}"):
        metrics = table.optimize.compact(
            target_size=target_size,
            commit_properties=CommitProperties(custom_metadata={"reclock.maintenance": "optimize"}),
        )
    return int(metrics.get("numFilesRemoved", 0))


def vacuum(table: DeltaTable, minutes: int) -> int:
    """Delete the files of ``table`` that no version of the last ``minutes`` needs; how many.

    delta-rs takes the retention in whole hours, so it is rounded up: files are kept at least as
    long as asked, never less. ``full`` mode also deletes files the log never referenced (a task's
    file whose batch crashed before its commit), but only once they are older than the retention
    too.
    """
    hours = -(-minutes // 60)
    with lake_io(f"vacuuming {Path(table.table_uri).name}"):
        removed = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True)
    return len(removed)

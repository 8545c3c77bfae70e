"""What delta-rs does after each of reclock's commits: a checkpoint every interval, and the expired
log dropped only with that checkpoint.

By default delta-rs looks for expired log entries after *every* commit: it lists the table's whole
``_delta_log`` and, on a local disk, stats each entry, so a commit's cost grows with the log's
length (on a local disk 3 of a commit's 9 ms of CPU at 300 versions; on S3 one LIST of the four
each table's batch made; docs/benchmarks.md, "The cost of a commit"). An entry can only be
dropped once a checkpoint covers it, and delta-rs writes a checkpoint only at every
``delta.checkpointInterval``-th version, so a look at any other commit finds nothing new to drop
but what time alone expired since: the log is kept to the same bound (the retention plus one
interval) when the look is made at the checkpoint's commit alone.
"""

from __future__ import annotations

from deltalake import DeltaTable, PostCommitHookProperties

__all__ = ["CHECKPOINT_INTERVAL", "hooks_for_next_commit"]

#: delta-rs's default ``delta.checkpointInterval``: the table property, when set, wins.
CHECKPOINT_INTERVAL = 100


def hooks_for_next_commit(table: DeltaTable) -> PostCommitHookProperties:
    """The post-commit hooks of a commit made on ``table``'s snapshot: the checkpoint as delta-rs
    makes it, and the expired log dropped only when that commit is a checkpoint's."""
    interval = int(table.metadata().configuration.get("delta.checkpointInterval", CHECKPOINT_INTERVAL))
    version = table.version() + 1
    checkpoint = (version + 1) % interval == 0  # delta-rs's rule: versions 99, 199, ... (9, 19, ... at 10)
    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=checkpoint)

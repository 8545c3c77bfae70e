"""What delta-rs does after each of reclock's commits: a checkpoint every interval, and the expired
log dropped only with that checkpoint; and the interval itself, which reclock sets on its tables.

**The interval.** delta-rs rebuilds a table's snapshot after every commit, and again when the
table is read back (``update_incremental``, ``load_as_version``), by replaying every log entry
since the last checkpoint: the CPU of a commit and of its read-back grows from one checkpoint to
the next. At delta-rs's default of a checkpoint every 100 versions a commit of one file took 3.5
ms of CPU right after a checkpoint and 17.6 ms just before the next (a read-back 2.7 and 13.8 ms);
at 10, 4.6-5.1 and 2.5-2.8 ms, checkpoints included (docs/benchmarks.md, "The cost of a commit"). So
every table reclock creates on a local disk gets ``delta.checkpointInterval = 10``
(:func:`table_properties`), Delta Lake's own default on Spark. On an object store a checkpoint
costs requests, which are billed and take 10-50 ms each (its PUTs, a LIST, a HEAD and a GET:
a batch of five tables made 15.5 LISTs instead of 15 at an interval of 10, and 29 GETs of log
objects instead of 19 while younger than 100 versions), so a table there keeps delta-rs's 100. A
local table made before has no interval until maintenance gives it this one
(:func:`~reclock.persist.maintenance.set_retention`); a table that has one keeps it.

**The look for expired entries.** By default delta-rs looks for expired log entries after *every*
commit: it lists the table's whole ``_delta_log`` and, on a local disk, stats each entry, so a
commit's cost grows with the log's length (on a local disk 3 of a commit's 9 ms of CPU at 300
versions; on S3 one LIST of the four each table's batch made). An entry can only be dropped once
a checkpoint covers it, so the look is made only at a checkpoint's commit, and only at every
checkpoint that ends a run of :data:`LOOK_EVERY` (100) versions: the log is kept to the bound it had
at delta-rs's default interval (the retention plus 100 versions), and a table lists its log for
expired entries no more often than it did then (an S3 LIST every 100 commits, not every 10).
"""

from __future__ import annotations

from deltalake import DeltaTable, PostCommitHookProperties

__all__ = [
    "CHECKPOINT_INTERVAL",
    "DELTA_RS_CHECKPOINT_INTERVAL",
    "INTERVAL_PROPERTY",
    "LOOK_EVERY",
    "hooks_for_next_commit",
    "table_properties",
]

#: The ``delta.checkpointInterval`` reclock gives every table it creates on a local disk.
CHECKPOINT_INTERVAL = 10
#: delta-rs's default, for a table without the property (and reclock's on an object store).
DELTA_RS_CHECKPOINT_INTERVAL = 100
INTERVAL_PROPERTY = "delta.checkpointInterval"
#: Versions between two looks for expired log entries (rounded up to a multiple of the interval).
LOOK_EVERY = 100


def table_properties(location: str) -> dict[str, str]:
    """The properties of a table reclock creates at ``location`` (a path, or a store's URI): its
    checkpoint interval, on a local disk only."""
    local = "://" not in location or location.startswith("file://")
    return {INTERVAL_PROPERTY: str(CHECKPOINT_INTERVAL)} if local else {}


def hooks_for_next_commit(table: DeltaTable) -> PostCommitHookProperties:
    """The post-commit hooks of a commit made on ``table``'s snapshot: the checkpoint as delta-rs
    makes it, and the expired log dropped only at a checkpoint that ends a run of
    :data:`LOOK_EVERY` versions."""
    interval = int(table.metadata().configuration.get(INTERVAL_PROPERTY, DELTA_RS_CHECKPOINT_INTERVAL))
    look_every = -(-LOOK_EVERY // interval) * interval  # a multiple of the interval: a checkpoint's version
    version = table.version() + 1
    look = (version + 1) % look_every == 0  # delta-rs checkpoints versions 9, 19, ... at 10; 99, 199, ... at 100
    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=look)

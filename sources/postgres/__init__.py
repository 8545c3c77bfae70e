"""PostgreSQL logical replication as a reclock source: tables of one database on one timeline.

Stages, one module each: :mod:`~reclock.sources.postgres.config` (options),
:mod:`~reclock.sources.postgres.catalog` (tables, keys, replica identity, the publication),
:mod:`~reclock.sources.postgres.snapshot` (the slot and its consistent initial copy, captured
by tasks), :mod:`~reclock.sources.state` (where it is kept: the lake, local or in S3),
:mod:`~reclock.sources.postgres.pgoutput` (the replication messages),
:mod:`~reclock.sources.postgres.columns` (their values as Arrow), :mod:`~reclock.sources.postgres.changes`
(transactions as output batches), :mod:`~reclock.sources.postgres.stream` (the reader of a
replication range), :mod:`~reclock.sources.postgres.source` (the contract, the probe, the committer).
"""

from reclock.sources.postgres.source import WAL, PostgresSource

__all__ = ["WAL", "PostgresSource"]

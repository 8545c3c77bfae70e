"""PostgreSQL logical replication as a reclock source (issue 22).

Stages, one module each: :mod:`~reclock.sources.postgres.pgoutput` decodes the replication
messages, :mod:`~reclock.sources.postgres.columns` types their text values as Arrow columns.
"""

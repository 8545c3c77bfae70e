"""MariaDB and MySQL binlog CDC as a reclock source: tables of one database on one timeline.

Stages, one module each: :mod:`~reclock.sources.mysql.config` (options),
:mod:`~reclock.sources.mysql.clients` (connections, and what the server's errors mean),
:mod:`~reclock.sources.mysql.catalog` (the server's settings, privileges, the tables),
:mod:`~reclock.sources.mysql.position` (binlog positions as source time),
:mod:`~reclock.sources.mysql.snapshot` (the consistent initial copy),
:mod:`~reclock.sources.mysql.changes` (changes as output batches),
:mod:`~reclock.sources.mysql.stream` (the reader of a binlog range),
:mod:`~reclock.sources.mysql.source` (the contract).
"""

from reclock.sources.mysql.source import BINLOG, MysqlSource

__all__ = ["BINLOG", "MysqlSource"]

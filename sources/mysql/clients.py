"""Connections to the server, and what its errors mean for the pipeline.

Errors are sorted once, here. The server unreachable or a connection lost is
:class:`MysqlUnavailable` (transient: the pipeline stalls and resumes exactly where it was). A
missing privilege and a binlog the server purged are :class:`~reclock.errors.DefiniteSourceError`
with one line naming the privilege or the position: retrying cannot cure them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql

from reclock.errors import DefiniteSourceError, TransientError
from reclock.sources.mysql.config import MysqlOptions

__all__ = ["PRIVILEGES", "MysqlUnavailable", "connect", "server_errors"]

#: What the source needs granted (MariaDB 10.5+ calls REPLICATION CLIENT ``BINLOG MONITOR``).
PRIVILEGES = "REPLICATION SLAVE, REPLICATION CLIENT, SELECT"

#: Client-side codes of a server that cannot be reached or went away.
_LOST = {2003, 2006, 2013, 2014, 2055}
#: Server codes of a refused privilege: ER_DBACCESS_DENIED, ER_ACCESS_DENIED, ER_SPECIFIC_ACCESS_DENIED,
#: ER_TABLEACCESS_DENIED.
_DENIED = {1044, 1045, 1227, 1142}
#: ER_MASTER_FATAL_ERROR_READING_BINLOG: the dump's start is not in the binlog (purged, or never).
_BINLOG_GONE = 1236


class MysqlUnavailable(TransientError):
    """The server cannot be reached, or dropped the connection: retry, the data is fine."""


def connect(options: MysqlOptions, **kwargs: Any) -> Any:
    """A PyMySQL connection to the source's database, in UTC (timestamps read as the binlog holds them)."""
    with server_errors(options):
        return pymysql.connect(
            **options.connection(), database=options.database, init_command="SET time_zone = '+00:00'", **kwargs
        )


def _code(exc: BaseException) -> int | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], int) else None


@contextmanager
def server_errors(options: MysqlOptions, *, position: str | None = None) -> Iterator[None]:
    """Turn PyMySQL's errors into the pipeline's kinds (module docstring); ``position`` names the
    binlog position a read starts at, for the purged-binlog error."""
    try:
        yield
    except pymysql.err.MySQLError as exc:
        code = _code(exc)
        text = str(exc.args[1] if len(exc.args) > 1 else exc).strip().splitlines()[0]
        if code in _DENIED:
            what = f"SELECT on database {options.database}" if code in (1044, 1142) else "a privilege"
            raise DefiniteSourceError(
                f"user {options.user} lacks {what} on {options.host}:{options.port} ({text}): "
                f"GRANT {PRIVILEGES} ON *.* TO '{options.user}'"
            ) from None
        if code == _BINLOG_GONE:
            raise DefiniteSourceError(
                f"the binlog at {position or 'the resume position'} is no longer on the server ({text}): it was "
                "purged before the pipeline read it (binlog_expire_logs_seconds, PURGE BINARY LOGS); "
                "recreate the pipeline to take a new snapshot"
            ) from None
        if code in _LOST or isinstance(exc, pymysql.err.InterfaceError):
            raise MysqlUnavailable(
                f"lost the connection to the MySQL server {options.host}:{options.port}: {text}"
            ) from None
        raise

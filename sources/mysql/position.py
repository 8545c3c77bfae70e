"""Source time of the MySQL source: a binlog position as one offset of one partition, :data:`BINLOG`.

A server writes its binlog as numbered files (``binlog.000007``) of byte positions, each
transaction one group of events written at its commit, in commit order. The offset of a position
is ``file number * 2**32 + byte position`` (a binlog file's positions are 32-bit), so offsets are
ordered exactly as the binlog is, across file rotations. A transaction's offset is the position
its group starts at; the probe is the server's current position (``SHOW MASTER STATUS``: the end
of the last group written), so a transaction is complete at a probe (``offset < upper``) whole or
not at all. docs/design/20261202_mysql_source.md says why one total order and not a partition per
GTID domain.

A frontier's offset here is always the start of a group (a probe, or a consistent snapshot's
position), so a reader of ``[lower, upper)`` starts the binlog dump at ``lower`` itself.
"""

from __future__ import annotations

from typing import Any

from reclock.errors import DefiniteSourceError

__all__ = ["BINLOG", "check_kept", "current", "offset_of", "position_of", "text"]

#: The source's one partition: the server's binlog, in positions of group starts.
BINLOG = "binlog"

_FILE = 1 << 32


def offset_of(file: str, pos: int) -> int:
    """The offset of ``file:pos`` (``binlog.000007``, 1234)."""
    base, _, number = file.rpartition(".")
    if not base or not number.isdigit():
        raise DefiniteSourceError(f"binlog file name {file!r} has no number: the source cannot order its positions")
    assert 0 <= pos < _FILE, f"a binlog position is 32-bit: {pos}"
    return int(number) * _FILE + pos


def position_of(offset: int, base: str) -> tuple[str, int]:
    """The binlog ``(file, pos)`` of ``offset``; ``base`` is the server's binlog base name
    (``binlog``), its numbers six digits wide as servers write them."""
    number, pos = divmod(offset, _FILE)
    return f"{base}.{number:06d}", pos


def text(offset: int, base: str) -> str:
    """``binlog.000007:1234``, for messages."""
    file, pos = position_of(offset, base)
    return f"{file}:{pos}"


def current(cursor: Any) -> tuple[str, int]:
    """The server's binlog position now: the end of the last group written. ``SHOW MASTER
    STATUS`` on MariaDB and MySQL before 8.4, ``SHOW BINARY LOG STATUS`` on MySQL 8.4+ (which
    removed the other); no row at all means the binlog is off."""
    for statement in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
        try:
            cursor.execute(statement)
        except Exception as exc:  # a syntax error (1064) on the server that lacks the statement
            if exc.args and exc.args[0] == 1064:
                continue
            raise
        row = cursor.fetchone()
        if row is None:
            raise DefiniteSourceError("the server's binary log is off: start it with log_bin (and binlog_format = ROW)")
        return row[0], int(row[1])
    raise DefiniteSourceError("the server answers neither SHOW MASTER STATUS nor SHOW BINARY LOG STATUS")


def check_kept(cursor: Any, offset: int, base: str) -> None:
    """A :class:`~reclock.errors.DefiniteSourceError` naming the position if the binlog file
    ``offset`` is in is no longer on the server (``SHOW BINARY LOGS``): the changes from there on
    are gone, and a read from it would fail; checked before a read starts, as peers learned to
    (Flink CDC #1947, RisingWave #12313)."""
    file, _ = position_of(offset, base)
    cursor.execute("SHOW BINARY LOGS")
    kept = sorted(row[0] for row in cursor.fetchall())
    if file not in kept:
        oldest = kept[0] if kept else "none"
        raise DefiniteSourceError(
            f"binlog {text(offset, base)}, where the pipeline resumes, was purged from the server (its oldest binlog "
            f"is {oldest}; see binlog_expire_logs_seconds): the changes since are gone; recreate the pipeline to "
            "take a new snapshot"
        )

"""Connections to the server, and what its errors mean for the pipeline.

Every connection uses :data:`~reclock.sources.postgres.columns.SESSION_OPTIONS`, so values have
one text form. Errors are sorted once, here: the server unreachable, a connection lost, the slot
busy for longer than a read may wait are :class:`PostgresUnavailable` (transient: the pipeline
stalls and resumes exactly where it was); a dropped slot or publication, an invalidated slot are
:class:`~reclock.errors.DefiniteSourceError` with one line saying what happened and what to do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2.extras import LogicalReplicationConnection

from reclock.errors import DefiniteSourceError, TransientError
from reclock.sources.postgres.columns import SESSION_OPTIONS

__all__ = ["PostgresUnavailable", "SlotInUse", "connect", "replication", "server_errors"]


class PostgresUnavailable(TransientError):
    """The server cannot be reached, or dropped the connection: retry, the data is fine."""


class SlotInUse(PostgresUnavailable):
    """The slot is held by another connection: usually a reader that closed a moment ago and
    whose walsender has not let go yet, so a wait of milliseconds is the usual cure."""


def connect(dsn: str, *, replication: bool = False, timeout_s: float = 10.0) -> Any:
    """A connection (autocommit for plain ones); :class:`PostgresUnavailable` if none can be made."""
    try:
        if replication:
            conn = psycopg2.connect(
                dsn,
                connection_factory=LogicalReplicationConnection,
                options=SESSION_OPTIONS,
                connect_timeout=max(1, int(timeout_s)),
            )
        else:
            conn = psycopg2.connect(dsn, options=SESSION_OPTIONS, connect_timeout=max(1, int(timeout_s)))
            conn.autocommit = True
    except psycopg2.OperationalError as exc:
        raise PostgresUnavailable(f"cannot connect to the Postgres server: {_first_line(exc)}") from None
    return conn


@contextmanager
def server_errors(slot: str, publication: str) -> Iterator[None]:
    """Turn psycopg2's errors into the pipeline's kinds (see the module docstring)."""
    try:
        yield
    except psycopg2.errors.UndefinedObject as exc:
        text = _first_line(exc)
        if "publication" in text:
            raise DefiniteSourceError(
                f"publication {publication} was dropped ({text}): recreate it for the source's tables, or recreate "
                "the pipeline"
            ) from None
        raise DefiniteSourceError(
            f"replication slot {slot} was dropped ({text}): the changes since the pipeline's last batch are gone; "
            "recreate the pipeline to take a new snapshot"
        ) from None
    except psycopg2.errors.ObjectNotInPrerequisiteState as exc:
        text = _first_line(exc)
        if "active" in text:
            raise PostgresUnavailable(f"replication slot {slot} is in use by another connection: {text}") from None
        raise DefiniteSourceError(
            f"replication slot {slot} can no longer be read ({text}): the server removed WAL it needed "
            "(max_slot_wal_keep_size); recreate the pipeline"
        ) from None
    except psycopg2.errors.ObjectInUse as exc:  # an OperationalError: sorted before the lost connection
        raise SlotInUse(f"replication slot {slot} is in use by another connection: {_first_line(exc)}") from None
    except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
        raise PostgresUnavailable(f"lost the connection to the Postgres server: {_first_line(exc)}") from None


def replication(dsn: str, slot: str, publication: str, start_lsn: int, *, wait_s: float) -> tuple[Any, Any]:
    """A replication connection streaming ``slot`` from ``start_lsn`` (``0``: where the slot
    confirmed), with pgoutput protocol 1 for ``publication``.

    A slot is read by one connection at a time, and a closed one takes a moment to let go of it:
    a busy slot is waited for up to ``wait_s``, then a :class:`PostgresUnavailable`.
    """
    deadline = time.monotonic() + wait_s
    while True:
        conn = connect(dsn, replication=True, timeout_s=wait_s)
        try:
            with server_errors(slot, publication):
                cursor = conn.cursor()
                cursor.start_replication(
                    slot_name=slot,
                    decode=False,
                    start_lsn=start_lsn,
                    options={"proto_version": "1", "publication_names": publication},
                )
            return conn, cursor
        except PostgresUnavailable:
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except BaseException:
            conn.close()
            raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""Baselines for reading a replication range: the server's own ``pg_recvlogical`` and psycopg2's
raw replication loop, each decoding the same changes to nothing.

Both read a slot of the ``pgoutput`` plugin from its start to ``end`` (an LSN past the last
change), with the publication the Postgres source uses: the server decodes the WAL and sends the
same messages reclock's reader gets. ``pg_recvlogical`` writes them to ``/dev/null`` (no fsync,
``-F 0``); the psycopg2 loop counts the insert, update and delete messages and drops them. Neither
turns a value into anything, lands a row or commits a table: they are the floor a reader of the
slot cannot go under.
"""

from __future__ import annotations

import select
import subprocess
import time
from contextlib import closing
from pathlib import Path

__all__ = ["pg_recvlogical", "replication_loop"]


def _lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def pg_recvlogical(binary: Path, dsn: str, slot: str, publication: str, end: int) -> None:
    """Stream ``slot`` to ``end`` into ``/dev/null``; fails unless the program stopped there itself."""
    argv = [str(binary), "-d", dsn, "--slot", slot, "--start", "--no-loop", "-F", "0", "-s", "1"]
    argv += ["-o", "proto_version=1", "-o", f"publication_names={publication}", "-E", _lsn(end), "-f", "/dev/null"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({done.returncode}): {done.stderr.strip()}")


def replication_loop(dsn: str, slot: str, publication: str, end: int) -> int:
    """Read ``slot`` from its start until the server has sent its WAL to ``end``; the number of
    insert, update and delete messages (``I``, ``U``, ``D``) seen."""
    import psycopg2
    from psycopg2.extras import LogicalReplicationConnection

    changes = 0
    with closing(psycopg2.connect(dsn, connection_factory=LogicalReplicationConnection)) as conn:
        cur = conn.cursor()
        cur.start_replication(
            slot_name=slot, decode=False, options={"proto_version": "1", "publication_names": publication}
        )
        cur.send_feedback(reply=True)
        last = time.monotonic()
        while True:
            message = cur.read_message()
            if message is None:
                if cur.wal_end >= end:
                    return changes
                select.select([cur], [], [], 0.1)
                if time.monotonic() - last > 0.1:
                    cur.send_feedback(reply=True)
                    last = time.monotonic()
                continue
            if message.data_start >= end:
                return changes
            changes += message.payload[:1] in (b"I", b"U", b"D")

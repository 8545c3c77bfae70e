"""The tests' Postgres server: the demo's (:mod:`reclock.demo.postgres_server`), plus ground truth
read from its WAL files by the server's own ``pg_waldump``."""

from __future__ import annotations

import re
import subprocess

from reclock.demo.postgres_server import BIN
from reclock.demo.postgres_server import PostgresServer as DemoServer

__all__ = ["BIN", "PostgresServer"]


class PostgresServer(DemoServer):
    """The server ``reclock demo --source postgres`` starts, one per test session (conftest)."""

    def commit_lsns(self, start: str, end: str) -> dict[int, int]:
        """``{xid: LSN of its commit record}`` for the transactions committed between the LSNs
        ``start`` and ``end``, read by the server's own ``pg_waldump`` from the WAL files: ground
        truth that shares nothing with the source's decoder. Needs that WAL still kept (a test
        raises ``wal_keep_size`` first)."""
        argv = [str(BIN / "pg_waldump"), "-p", str(self.data / "pg_wal"), "-s", start, "-e", end, "-r", "Transaction"]
        done = subprocess.run(self._command(argv), capture_output=True, text=True)
        if done.returncode != 0 and "error in WAL record" not in done.stderr:
            raise RuntimeError(f"pg_waldump failed: {done.stderr.strip()}")
        found = {}
        for line in done.stdout.splitlines():
            match = re.search(r"tx:\s+(\d+), lsn: ([0-9A-F]+)/([0-9A-F]+),.*desc: COMMIT", line)
            if match:
                found[int(match.group(1))] = (int(match.group(2), 16) << 32) | int(match.group(3), 16)
        return found

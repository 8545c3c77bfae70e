"""A real PostgreSQL server in its own process: the Debian package's binaries, for the demo and the tests.

``reclock demo --source postgres`` and the Postgres source's tests start their server with this one
class, the way the Kafka demo and tests share :class:`~reclock.demo.broker.EmbeddedBroker`. The
machines this project runs on have PostgreSQL 15 from the Debian packages (``postgresql-15``), so
it uses them rather than a PyPI wheel that ships server binaries: one server version everywhere,
the same ``test_decoding`` and ``pg_recvlogical`` the differential test and the benchmarks compare
against (``pgserver``, the wheel there is, ships PostgreSQL 16 without ``test_decoding``; see
docs/design/20261125_postgres_demo.md). ``initdb`` and ``postgres`` refuse to run as root, so when
the caller is root the data directory is given to the ``postgres`` user and both run as that user
(``runuser``). The server listens on 127.0.0.1 on a free port with ``wal_level = logical``, trusts
local TCP connections (a throwaway cluster), and is stopped by its own PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import closing, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from reclock.errors import ReclockError

__all__ = ["BIN", "PostgresServer", "PostgresServerError"]

#: Where the Debian package puts the server binaries (initdb, postgres, pg_recvlogical).
BIN = Path("/usr/lib/postgresql/15/bin")


class PostgresServerError(ReclockError):
    """The server's binaries are missing, or the server could not be initialised or started."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A PostgreSQL cluster in a temporary folder on 127.0.0.1:<free port>; :meth:`stop` ends it by its PID.

    ``dsn(database)`` is a libpq connection string for the superuser ``postgres``; every test
    creates its own database with :meth:`create_database`, so tests share the server but no data.
    """

    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        if not (BIN / "postgres").exists():
            raise PostgresServerError(
                f"PostgreSQL 15 server binaries not found in {BIN}: install the Debian package postgresql-15"
            )
        # Its own temporary folder, not pytest's: the ``postgres`` user cannot enter root's 0700 one.
        root = self.root = Path(tempfile.mkdtemp(prefix="reclock-postgres-"))
        self.data = root / "data"
        self.port = _free_port()
        self.log = root / "postgres.log"
        self.settings = {
            "wal_level": "logical",
            "max_replication_slots": "40",
            "max_wal_senders": "40",
            "max_connections": "100",
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(root),
            "fsync": "off",
            "shared_buffers": "64MB",
            "wal_sender_timeout": "60s",
            **(settings or {}),
        }
        self._as_owner = os.geteuid() == 0
        if self._as_owner:
            shutil.chown(root, "postgres", "postgres")
        self._run([str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8"])
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def _command(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if self._as_owner else argv

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(self._command(argv), capture_output=True, text=True)
        if done.returncode != 0:
            raise PostgresServerError(f"{argv[0]} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        """Start (or restart, after :meth:`stop`) the server on the same port and data directory."""
        argv = [str(BIN / "postgres"), "-D", str(self.data)]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        log = open(self.log, "ab")  # noqa: SIM115 - the server's stderr for its life; closed with the process
        if self._as_owner:
            shutil.chown(self.log, "postgres", "postgres")
        self.process = subprocess.Popen(
            self._command(argv), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 60
        while not self._accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise PostgresServerError(f"postgres did not start on port {self.port}: {tail}")
            time.sleep(0.1)

    def _accepts(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.dsn("postgres"), connect_timeout=1).close()
        except psycopg2.OperationalError:
            return False
        return True

    def dsn(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def connect(self, database: str = "postgres") -> Any:
        """A plain autocommit connection (psycopg2) to ``database``; close it with ``contextlib.closing``
        (psycopg2's own ``with`` opens a transaction block, where ``CREATE DATABASE`` cannot run)."""
        import psycopg2

        conn = psycopg2.connect(self.dsn(database))
        conn.autocommit = True
        return conn

    def create_database(self, name: str) -> str:
        """A fresh database ``name`` (dropped first if a failed run left one); its DSN."""
        with closing(self.connect()) as conn, conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def stop(self, how: signal.Signals = signal.SIGINT) -> None:
        """Stop the server by its PID: ``SIGINT`` is PostgreSQL's fast shutdown, ``SIGKILL`` a crash.

        The ``postgres`` process is the ``runuser`` child (same session): the whole process group
        gets the signal, so the postmaster and its backends go together.
        """
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, how)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if how == signal.SIGKILL:
            # The postmaster's children may outlive it for a moment; the next start needs the port.
            deadline = time.monotonic() + 10
            while (self.data / "postmaster.pid").exists() and self._accepts() and time.monotonic() < deadline:
                time.sleep(0.1)

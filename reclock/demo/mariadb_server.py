"""A real MariaDB server in its own process: the Debian package's ``mariadbd``, for the tests and the demo.

The MySQL source's tests start their server with this one class, as the Postgres source's start
:class:`~reclock.demo.postgres_server.PostgresServer`. The machines this project runs on have
MariaDB 10.11 from the Debian package ``mariadb-server`` (``scripts/bootstrap`` installs it; Oracle
MySQL has no package there). The package's own service is never used: the server runs from a data
directory made by ``mariadb-install-db`` in a temporary folder, listens on 127.0.0.1 on a free
port (its socket in that folder), logs row-based binlogs with full row images and row metadata (what
a CDC reader needs, see docs/sources/mysql.md), and is stopped by its own PID. ``root`` connects
without a password over TCP: a throwaway server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from reclock.errors import ReclockError

__all__ = ["MariaDBServer", "MariaDBServerError", "server_binary"]


class MariaDBServerError(ReclockError):
    """The server's binaries are missing, or the server could not be initialised or started."""


def server_binary() -> str | None:
    """``mariadbd`` (or the older name ``mysqld``) on the PATH or in ``/usr/sbin``; ``None`` without it."""
    for name in ("mariadbd", "mysqld"):
        found = shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MariaDBServer:
    """A MariaDB server in a temporary folder on 127.0.0.1:<free port>; :meth:`stop` ends it by its PID.

    ``settings`` override the server options (``{"binlog_format": "MIXED"}``: a test of the
    source's refusal). Every test creates its own database with :meth:`create_database`, so tests
    share the server but no data.
    """

    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        binary = server_binary()
        installer = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if binary is None or installer is None:
            raise MariaDBServerError("MariaDB server binaries not found: install the Debian package mariadb-server")
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="reclock-mariadb-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.log = self.root / "mariadb.log"
        self.settings = {
            "port": str(self.port),
            "bind-address": "127.0.0.1",
            "socket": str(self.root / "mariadb.sock"),
            "pid-file": str(self.root / "mariadb.pid"),
            "log-bin": str(self.data / "binlog"),
            "binlog-format": "ROW",
            "binlog-row-image": "FULL",
            "binlog-row-metadata": "FULL",
            "server-id": "1",
            "innodb-buffer-pool-size": "128M",
            "innodb-flush-log-at-trx-commit": "2",
            "sync-binlog": "0",
            "skip-name-resolve": "ON",
            "max-connections": "200",
            "log-error": str(self.log),
            **{name.replace("_", "-"): value for name, value in (settings or {}).items()},
        }
        self._user = ["--user=root"] if os.geteuid() == 0 else []
        done = subprocess.run(
            [
                installer,
                f"--datadir={self.data}",
                *self._user,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise MariaDBServerError(f"{installer} failed: {done.stderr.strip() or done.stdout.strip()}")
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Start (or restart, after :meth:`stop`) the server on the same port and data directory."""
        argv = [self.binary, "--no-defaults", f"--datadir={self.data}", *self._user]
        argv += [f"--{name}={value}" for name, value in self.settings.items()]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while not self._accepts():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                self.stop()
                raise MariaDBServerError(f"mariadbd did not start on port {self.port}: {tail}")
            time.sleep(0.1)

    def _accepts(self) -> bool:
        import pymysql

        try:
            pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=1).close()
        except pymysql.err.OperationalError:
            return False
        return True

    def options(self, database: str) -> dict[str, Any]:
        """The MySQL source's connection options for ``database`` (as root)."""
        return {"host": "127.0.0.1", "port": self.port, "user": "root", "password": "", "database": database}

    def connect(self, database: str | None = None, **kwargs: Any) -> Any:
        """A PyMySQL connection in autocommit mode (a test's statements commit one by one unless it
        begins a transaction)."""
        import pymysql

        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", database=database, **{"autocommit": True, **kwargs}
        )

    def create_database(self, name: str) -> dict[str, Any]:
        """A fresh database ``name`` (dropped first if a failed run left one); its connection options."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
                cur.execute(f"CREATE DATABASE `{name}`")
        finally:
            conn.close()
        return self.options(name)

    def __enter__(self) -> MariaDBServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and remove its data directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        """Stop the server by its PID: ``SIGTERM`` is its clean shutdown, ``SIGKILL`` a crash."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(how)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

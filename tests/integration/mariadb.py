"""The tests' MariaDB server: the demo's (:mod:`reclock.demo.mariadb_server`), plus ground truth
read from its binlog files by the server package's own ``mysqlbinlog``."""

from __future__ import annotations

import re
import subprocess

from reclock.demo.mariadb_server import MariaDBServer as DemoServer

__all__ = ["MariaDBServer"]

_AT = re.compile(r"^# at (\d+)$")
_GTID = re.compile(r"\bGTID (\d+)-(\d+)-(\d+)\b")


class MariaDBServer(DemoServer):
    """The server the MySQL source's tests share, one per test session (conftest)."""

    def group_offsets(self) -> dict[str, int]:
        """``{"domain-server-seq": offset}``: where each transaction's group starts in the binlog,
        as the source numbers positions (file number * 2**32 + position), read by ``mysqlbinlog``
        from the binlog files: ground truth that shares nothing with the source's decoder."""
        files = sorted(p for p in self.data.glob("binlog.[0-9]*"))
        found = {}
        for path in files:
            number = int(path.suffix.lstrip("."))
            done = subprocess.run(["mysqlbinlog", str(path)], capture_output=True, text=True, check=True)
            at = None
            for line in done.stdout.splitlines():
                if match := _AT.match(line):
                    at = int(match.group(1))
                elif at is not None and (match := _GTID.search(line)) and line.startswith("#"):
                    found["-".join(match.groups())] = (number << 32) + at
        return found

"""Which binlog client the MySQL source decodes with: changes per second of each on one binlog.

``python -m benchmarks.mysql_decoders [CHANGES]`` starts the tests' MariaDB server
(:class:`~reclock.demo.mariadb_server.MariaDBServer`), writes ``CHANGES`` row changes (inserts,
then updates of every row, 100 changes a transaction) to a table of the source's usual shape
(``INT`` key, ``BIGINT``, ``VARCHAR``, ``DOUBLE``), and reads that same binlog range with:

* ``mysqlbinlog``: the server package's own reader (``--read-from-remote-server`` to
  ``/dev/null``), the floor any client is compared with (the issue's target: >= 0.5x of it);
* ``transport``: PyMySQL's packet reads of the binlog dump, no decoding: the ceiling of any
  decoder in this process;
* ``own``: a decoder of the row events' documented format written here for this one table, the
  values unpacked with ``struct`` into column lists (what decoding it ourselves starts from);
* ``mysql-replication``: pymysqlreplication's ``BinLogStreamReader``, a dict per row.

It prints one line per reader (changes/s, and the ratio to ``mysqlbinlog``): numbers for
docs/design/20261202_mysql_source.md, never asserted by a test.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time

from reclock.demo.mariadb_server import MariaDBServer

__all__ = ["main"]

ROWS_PER_TRANSACTION = 100


def _write(server: MariaDBServer, changes: int) -> tuple[str, int, str, int]:
    """``changes`` row changes into ``bench.events``; the binlog range they span."""
    server.create_database("bench")
    conn = server.connect("bench", autocommit=False)
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE events (id INT PRIMARY KEY, n BIGINT, name VARCHAR(32), score DOUBLE)")
        cur.execute("SHOW MASTER STATUS")
        start_file, start_pos = cur.fetchone()[:2]
        inserts = changes // 2
        for first in range(0, inserts, ROWS_PER_TRANSACTION):
            rows = [(i, i * 7, f"name-{i}", i / 3) for i in range(first, min(inserts, first + ROWS_PER_TRANSACTION))]
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s)", rows)
            conn.commit()
        for first in range(0, inserts, ROWS_PER_TRANSACTION):
            cur.execute("UPDATE events SET n = n + 1 WHERE id >= %s AND id < %s", (first, first + ROWS_PER_TRANSACTION))
            conn.commit()
        cur.execute("SHOW MASTER STATUS")
        end_file, end_pos = cur.fetchone()[:2]
    conn.close()
    return start_file, start_pos, end_file, end_pos


def _mysqlbinlog(server: MariaDBServer, start_file: str, start_pos: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            "mysqlbinlog",
            "--read-from-remote-server",
            "--host=127.0.0.1",
            f"--port={server.port}",
            "--user=root",
            f"--start-position={start_pos}",
            "--verbose",
            start_file,
        ],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - t0


def _dump(server: MariaDBServer, start_file: str, start_pos: int):
    """The binlog events from ``start_file:start_pos`` to the end, as raw bytes (non-blocking dump)."""
    conn = server.connect()
    with conn.cursor() as cur:
        cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
        cur.execute("SET @mariadb_slave_capability = 4")
    name = start_file.encode()
    packet = struct.pack("<iBIHI", len(name) + 11, 0x12, start_pos, 1, 99) + name
    conn._write_bytes(packet)
    conn._next_seq_id = 1
    while True:
        data = conn._read_packet()._data
        if data[0] == 0xFE and len(data) < 9:
            break
        yield data[1:]
    conn.close()


def _transport(server: MariaDBServer, start_file: str, start_pos: int) -> float:
    t0 = time.perf_counter()
    for _ in _dump(server, start_file, start_pos):
        pass
    return time.perf_counter() - t0


def _own(server: MariaDBServer, start_file: str, start_pos: int, expected: int) -> float:
    """Row events of ``bench.events`` decoded by hand: header, table map, rows (v1 and v2)."""
    t0 = time.perf_counter()
    columns: list[list] = [[], [], [], []]
    ours: set[int] = set()
    unpack_fixed = struct.Struct("<iq").unpack_from
    unpack_double = struct.Struct("<d").unpack_from
    for event in _dump(server, start_file, start_pos):
        kind = event[4]
        body = memoryview(event)[19:-4]  # the 19-byte header, the CRC32 after
        if kind == 19:  # TABLE_MAP_EVENT
            table_id = int.from_bytes(body[:6], "little")
            schema_len = body[8]
            name_at = 9 + schema_len + 1
            if bytes(body[name_at + 1 : name_at + 1 + body[name_at]]) == b"events":
                ours.add(table_id)
            continue
        if kind not in (23, 24, 30, 31):
            continue
        if int.from_bytes(body[:6], "little") not in ours:
            continue
        at = 8
        if kind >= 30:
            at += int.from_bytes(body[at : at + 2], "little")
        width = body[at]
        at += 1 + (width + 7) // 8 * (2 if kind in (24, 31) else 1)
        end = len(body)
        images = 2 if kind in (24, 31) else 1
        while at < end:
            for image in range(images):
                at += 1  # the null bitmap: no nulls in this table
                key, n = unpack_fixed(body, at)
                at += 12
                size = body[at]
                name = bytes(body[at + 1 : at + 1 + size]).decode()
                at += 1 + size
                (score,) = unpack_double(body, at)
                at += 8
                if image == images - 1:
                    columns[0].append(key)
                    columns[1].append(n)
                    columns[2].append(name)
                    columns[3].append(score)
    assert len(columns[0]) == expected, (len(columns[0]), expected)
    return time.perf_counter() - t0


def _replication(server: MariaDBServer, start_file: str, start_pos: int, expected: int) -> float:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

    t0 = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": "root", "passwd": ""},
        server_id=98,
        log_file=start_file,
        log_pos=start_pos,
        resume_stream=True,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent],
    )
    seen = 0
    for event in stream:
        for row in event.rows:
            seen += 1
            _ = row.get("values") or row.get("after_values")
    stream.close()
    assert seen == expected, (seen, expected)
    return time.perf_counter() - t0


def main(argv: list[str]) -> None:
    changes = int(argv[0]) if argv else 200_000
    with MariaDBServer() as server:
        start_file, start_pos, _, _ = _write(server, changes)
        base = _mysqlbinlog(server, start_file, start_pos)
        results = {
            "mysqlbinlog --verbose": base,
            "transport (PyMySQL packets)": _transport(server, start_file, start_pos),
            "own decoder (struct)": _own(server, start_file, start_pos, changes),
            "mysql-replication": _replication(server, start_file, start_pos, changes),
        }
    for name, seconds in results.items():
        print(f"{name:30s} {changes / seconds:12,.0f} changes/s  {base / seconds:6.2f}x mysqlbinlog")


if __name__ == "__main__":
    main(sys.argv[1:])

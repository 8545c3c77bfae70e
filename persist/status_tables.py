"""Status tables, after SingleStore's ``information_schema.PIPELINES*``: Delta tables a user can query.

``<lake>/_status/<table>`` for ``pipelines`` (state changes), ``batches`` (one row per batch
partition), ``files`` (file state changes), ``errors`` (operational failures: failed batch
attempts, stalls) and ``offsets`` (per source partition). Record-level errors and skipped ranges
are not here: they are rows of each pipeline's ``_errors`` output, committed exactly once with the
batch (``reclock errors`` shows both).

These tables are observability, not part of exactly-once, so rows are buffered and flushed by a
background thread about once a second: one small commit per table per flush whatever the batch
rate, and never on the batch's critical path. Each table is held open and written on its
snapshot, which the write advances, so a flush reads none of the log back; another job of the
lake appending to the same table only makes delta-rs rebase the append (appends never conflict).
Every few hundred flushes rows older than the retention are deleted and the tables are
maintained like outputs (small files compacted, files unreferenced for an hour vacuumed, the log
expiring after an hour), so a job that runs for months keeps them small in rows, files and log alike.

A job's rows are fenced like its data: each flush first calls the job's ``fence`` (its lease
check), so a driver that lost the pipeline to another writes no row after the takeover; what it
had buffered is dropped (the lake's truth, not these rows, is what the new driver restores from).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from reclock.persist import maintenance
from reclock.persist.lake import Lake
from reclock.persist.lease import LeaseLost
from reclock.persist.post_commit import hooks_for_next_commit, table_properties
from reclock.persist.read import read_table
from reclock.timeline.frontier import wall_clock_ms

__all__ = ["STATUS_SCHEMAS", "StatusTables", "read_status_table"]

log = logging.getLogger("reclock.status")

_S, _I, _B = pa.string(), pa.int64(), pa.bool_()

STATUS_SCHEMAS: Mapping[str, pa.Schema] = {
    "pipelines": pa.schema(
        [
            ("pipeline", _S),
            ("state", _S),
            ("health", _S),
            ("finished", _B),
            ("config", _S),
            ("last_error", _S),
            ("time_ms", _I),
        ]
    ),
    "batches": pa.schema(
        [
            ("pipeline", _S),
            ("batch_id", _I),
            ("state", _S),
            ("partition", _S),
            ("rows", _I),
            ("filtered", _I),  # rows transforms dropped on purpose (WHERE), counted, not stored
            ("bytes", _I),
            ("earliest_offset", _I),
            ("latest_offset", _I),
            ("start_ms", _I),
            ("duration_ms", _I),
            ("error", _S),
            ("time_ms", _I),
            ("probe_ms", _I),
            ("mint_ms", _I),
            ("plan_ms", _I),
            ("read_ms", _I),
            ("commit_ms", _I),
            ("maintenance_ms", _I),  # the job's table maintenance after this batch, when it ran one
        ]
    ),
    "files": pa.schema(
        [
            ("pipeline", _S),
            ("path", _S),
            ("generation", _I),
            ("size", _I),
            ("state", _S),
            ("batch_id", _I),
            ("time_ms", _I),
        ]
    ),
    "errors": pa.schema(
        [
            ("pipeline", _S),
            ("kind", _S),
            ("code", _S),
            ("message", _S),
            ("batch_id", _I),
            ("partition", _S),
            ("offset", _I),
            ("time_ms", _I),
        ]
    ),
    "offsets": pa.schema(
        [
            ("pipeline", _S),
            ("partition", _S),
            ("earliest", _I),
            ("latest", _I),
            ("latest_loaded", _I),
            ("time_ms", _I),
            ("source_latest", _I),  # the source's upper at the batch's probe (Kafka: the high watermark)
        ]
    ),
}


#: Status readers are short CLI calls: an hour of history for them is plenty.
_STATUS_HISTORY_MINUTES = 60
_STATUS_FILE_BYTES = 32 << 20


class StatusTables:
    """Buffered appender for the status tables of one lake; ``close`` flushes what is left.

    ``fence`` is called before every write and raises once this writer may not write any more
    (:class:`~reclock.persist.lease.LeaseLost`: from then on nothing is written or kept).
    """

    def __init__(
        self,
        lake: Lake,
        *,
        retention_days: float = 7.0,
        flush_interval: float = 1.0,
        fence: Callable[[], None] = lambda: None,
    ) -> None:
        self.lake = lake
        self._fence = fence
        self._fenced = False
        self.retention_ms = int(retention_days * 86_400_000)
        self._buffer: dict[str, list[dict[str, Any]]] = {name: [] for name in STATUS_SCHEMAS}
        self._lock = threading.Lock()
        self._flushes = 0
        self._tables: dict[str, DeltaTable] = {}  # held open once written: see the module doc
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(flush_interval,), daemon=True, name="status")
        self._thread.start()

    def append(self, table: str, rows: list[dict[str, Any]]) -> None:
        now = wall_clock_ms()
        with self._lock:
            if not self._fenced:
                self._buffer[table].extend({"time_ms": now, **row} for row in rows)

    def flush(self) -> None:
        with self._lock:
            pending = {name: rows for name, rows in self._buffer.items() if rows}
            self._buffer = {name: [] for name in STATUS_SCHEMAS}
        for name, rows in pending.items():
            data = pa.Table.from_pylist(rows, schema=STATUS_SCHEMAS[name])
            try:
                self._check()
                self._write(name, data)
            except LeaseLost:
                return
            except Exception as exc:  # observability must never take the pipeline down
                self._tables.pop(name, None)  # opened afresh next time, whatever state the failure left
                log.warning("could not write status table %s: %s", name, exc)
        self._flushes += 1
        if self._flushes % 500 == 1:
            self._maintain()

    def _write(self, name: str, data: pa.Table) -> None:
        """Append ``data`` to table ``name``, on its held snapshot once there is one."""
        table = self._tables.get(name)
        if table is None:
            path = self.lake.status_table_path(name)
            if not self.lake.store.is_table(path):
                write_deltalake(
                    str(path),
                    data,
                    mode="append",
                    schema_mode="merge",
                    configuration=table_properties(str(path)),
                    storage_options=self.lake.store.delta_options,
                )
                self._tables[name] = self.lake.store.open_table(path)
                return
            table = self._tables[name] = self.lake.store.open_table(path)
        # schema_mode "merge": a lake written before a column was added gains it
        write_deltalake(
            table, data, mode="append", schema_mode="merge", post_commithook_properties=hooks_for_next_commit(table)
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.flush()

    def _check(self) -> None:
        """The fence; once it raises :class:`LeaseLost`, every buffered and later row is dropped."""
        if not self._fenced:
            try:
                self._fence()
                return
            except LeaseLost:
                with self._lock:
                    self._fenced = True
                    self._buffer = {name: [] for name in STATUS_SCHEMAS}
        raise LeaseLost("the status tables are another driver's to write now")

    def _maintain(self) -> None:
        """Expire old rows, then compact and vacuum; other jobs of the lake may do it at once."""
        cutoff = wall_clock_ms() - self.retention_ms
        for name in STATUS_SCHEMAS:
            path = self.lake.status_table_path(name)
            try:  # all of it: an exception here would end the flushing thread for good
                self._check()
                table = self._tables.get(name)
                if table is None:
                    if not self.lake.store.is_table(path):
                        continue
                    table = self._tables[name] = self.lake.store.open_table(path)
                table.update_incremental()
                table.delete(f"time_ms < {cutoff}")
                maintenance.set_retention(table, _STATUS_HISTORY_MINUTES)
                maintenance.optimize(table, _STATUS_FILE_BYTES)
                maintenance.vacuum(table, _STATUS_HISTORY_MINUTES)
            except LeaseLost:
                return
            except Exception as exc:
                self._tables.pop(name, None)
                log.info("status retention on %s deferred: %s", name, exc)


def read_status_table(lake: Lake, table: str, pipeline: str | None = None) -> pa.Table:
    """A status table's rows, oldest first, optionally of one pipeline (empty if never written)."""
    path = lake.status_table_path(table)
    if not lake.store.is_table(path):
        return STATUS_SCHEMAS[table].empty_table()
    filters = [("pipeline", "=", pipeline)] if pipeline else None
    return read_table(lake.store.open_table(path), filters=filters, store=lake.store).sort_by("time_ms")

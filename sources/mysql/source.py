"""The MySQL source itself: :class:`MysqlSource` wires the stages into the source contract.

Tables of one MariaDB (or MySQL) database, read from the server's binlog; one output per table,
named ``<database>_<table>``, ``upsert`` by its primary key.

**Source time is the binlog position of the transaction's group** (one partition,
:data:`~reclock.sources.mysql.position.BINLOG`): every change of a transaction, in every table,
carries it, so a transaction is complete at a binding whole or not at all and all its rows get one
``_into_ts``. Below the snapshot's position the offsets are its chunks
(:mod:`~reclock.sources.mysql.snapshot`).

* ``upper`` (the probe, on the driver): the server's current binlog position, the end of the
  last group written. The first probe captures the snapshot (the driver copies it into chunk
  files and writes the manifest before anything is bound).
* ``cap``: the first binding is the snapshot's position alone, so every chunk lands at one into
  time, a cut of the database at that position.
* ``splits``: one split per snapshot chunk, and one binlog range ``[lower, upper)`` (a dump is
  one connection's sequence of events, so the range is not cut).
* ``read``: a chunk from its file, a range from a binlog dump
  (:mod:`~reclock.sources.mysql.stream`); both replayable while the server keeps the binlog.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from reclock.envelope import UPSERT
from reclock.errors import ConfigError
from reclock.sources.base import (
    DistinctInserts,
    KeepsUnknownFields,
    Output,
    SourceBase,
    SourceContext,
    Split,
    check_record_error_policy,
)
from reclock.sources.mysql.catalog import TableSpec, check_privileges, check_settings, describe
from reclock.sources.mysql.changes import Change, upsert_batch
from reclock.sources.mysql.clients import connect, server_errors
from reclock.sources.mysql.config import MysqlOptions, default_server_id
from reclock.sources.mysql.position import BINLOG, current, offset_of
from reclock.sources.mysql.snapshot import Chunk, Manifest, capture, load, read_chunk
from reclock.sources.mysql.stream import read_range
from reclock.sources.state import StateFolder
from reclock.timeline.frontier import Frontier, encode_partition

__all__ = ["BINLOG", "ChunkSplit", "MysqlSource", "RangeSplit"]


@dataclass(frozen=True)
class ChunkSplit(Split):
    """One snapshot chunk (offset ``start`` = the chunk's index), read from its file."""

    chunk: Chunk | None = None

    @property
    def weight(self) -> int:
        return self.chunk.rows if self.chunk is not None else 1


@dataclass(frozen=True)
class RangeSplit(Split):
    """The transactions whose binlog groups start in ``[start, end)``."""

    base: str = ""


class MysqlSource(SourceBase, DistinctInserts, KeepsUnknownFields):
    """Tables of one MariaDB or MySQL database, through its binlog (module docstring)."""

    #: Rows per Arrow batch a range's read yields (bounded memory per task).
    flush_rows: int = 50_000

    def __init__(
        self,
        *,
        database: str,
        tables: Sequence[str],
        user: str,
        password: str = "",
        host: str = "127.0.0.1",
        port: int = 3306,
        envelope: str = UPSERT,
        server_id: int | None = None,
        snapshot: bool = True,
        snapshot_chunk_rows: int = 100_000,
        read_timeout_s: float = 30.0,
        state_dir: str | StateFolder | None = None,
        on_record_error: str = "skip",
    ) -> None:
        if server_id is None:
            raise ConfigError("server_id", "name the replica id (a pipeline's default is derived from its name)")
        self.options = MysqlOptions.check(
            host=host,
            port=port,
            user=user,
            password=password,
            database=database,
            tables=tables,
            envelope=envelope,
            server_id=server_id,
            snapshot=snapshot,
            snapshot_chunk_rows=snapshot_chunk_rows,
            read_timeout_s=read_timeout_s,
        )
        if isinstance(state_dir, str) and not state_dir:
            raise ConfigError("state_dir", "must be a folder's path or an s3:// URI, got ''")
        #: Where the snapshot is kept; ``None`` for a source built only to check a definition.
        self.state = StateFolder.at(state_dir) if isinstance(state_dir, str) else state_dir
        self.on_record_error = check_record_error_policy(on_record_error)
        conn = connect(self.options)
        try:
            with server_errors(self.options), conn.cursor() as cur:
                check_settings(cur)
                check_privileges(cur, self.options.user)
                current(cur)
                self.specs: tuple[TableSpec, ...] = describe(
                    cur, self.options.database, self.options.tables, self.options.user
                )
        finally:
            conn.close()
        self._unknown: frozenset[str] = frozenset()
        self._manifest: Manifest | None = None

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> MysqlSource:
        """The pipeline's source: a replica id derived from the pipeline's name unless given, the
        snapshot kept in the pipeline's folder of the lake, the pipeline's ``on_record_error``."""
        state = None if context.state_path is None else StateFolder.at(context.state_path, context.state_options)
        defaults = {"server_id": default_server_id(context.pipeline), "state_dir": state}
        return cls(**{**defaults, **options, "on_record_error": context.on_record_error})

    # -- the Source protocol --------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        return [spec.as_output(self.options.envelope) for spec in self.specs]

    def keep_unknown_fields(self, outputs: Sequence[str]) -> None:
        """Columns added to these outputs' tables go on as unknown fields (``schema_evolution``)."""
        known = {spec.output for spec in self.specs}
        unknown = [name for name in outputs if name not in known]
        if unknown:
            raise ConfigError(f"outputs.{unknown[0]}.schema_evolution", f"the source has no output {unknown[0]!r}")
        self._unknown = frozenset(outputs)

    def upper(self) -> Frontier:
        """The server's binlog position now (at least the snapshot's); the first probe captures
        the snapshot (:mod:`~reclock.sources.mysql.snapshot`)."""
        manifest = self._captured()
        conn = connect(self.options)
        try:
            with server_errors(self.options), conn.cursor() as cur:
                now = offset_of(*current(cur))
        finally:
            conn.close()
        return Frontier({BINLOG: max(now, manifest.position)})

    def cap(self, lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
        """The snapshot is bound alone (its chunks at one into time, a cut of the database at its
        position, the first batch nothing but inserts of distinct keys); otherwise never cut:
        offsets are binlog bytes, not records, and a range is read by one dump anyway."""
        position = self._captured().position
        if lower.offset(BINLOG) < position < upper.offset(BINLOG):
            return Frontier({BINLOG: position})
        return upper

    def distinct_inserts(self, splits: Sequence[Split]) -> frozenset[str]:
        """A batch of snapshot chunks only inserts each row of a table once (its primary key)."""
        if not splits or not all(isinstance(s, ChunkSplit) and s.chunk is not None for s in splits):
            return frozenset()
        return frozenset(s.chunk.output for s in splits if isinstance(s, ChunkSplit) and s.chunk is not None)

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[Split]:
        manifest = self._captured()
        start, end = lower.offset(BINLOG), upper.offset(BINLOG)
        out: list[Split] = [
            ChunkSplit(BINLOG, i, i + 1, chunk) for i, chunk in enumerate(manifest.chunks) if start <= i < end
        ]
        begin = max(start, manifest.position)
        if begin < end:
            out.append(RangeSplit(BINLOG, begin, end, manifest.base))
        return out

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The rows of a chunk, or the changes of a range; the same for the same split."""
        partition = encode_partition(BINLOG)
        fail = self.on_record_error == "fail"
        if isinstance(split, ChunkSplit):
            assert split.chunk is not None
            spec = next(spec for spec in self.specs if spec.output == split.chunk.output)
            assert self.state is not None, "a chunk split is made only once the snapshot is captured"
            rows = read_chunk(self.state, split.chunk).to_pylist()
            changes = [Change(split.start, False, row) for row in rows]
            yield from upsert_batch(spec, partition, changes, unknown=spec.output in self._unknown, fail=fail)
            return
        assert isinstance(split, RangeSplit), f"not a split of the MySQL source: {split!r}"
        yield from read_range(
            self.options,
            self.specs,
            split.base,
            split.start,
            split.end,
            partition=partition,
            unknown=self._unknown,
            fail=fail,
            flush_rows=self.flush_rows,
        )

    def __repr__(self) -> str:
        o = self.options
        return f"MysqlSource(database={o.database!r}, tables={list(o.tables)!r}, server={o.host}:{o.port})"

    # -- internals ------------------------------------------------------------------------------

    def _captured(self) -> Manifest:
        """The snapshot's manifest (by the driver and its tasks): read on first need, captured
        here, on the driver's first probe, if there is none yet."""
        if self._manifest is None:
            if self.state is None:
                raise ConfigError(
                    "state_dir",
                    "the source keeps its snapshot in a folder every task reaches: give state_dir (a path or an "
                    "s3:// URI), or run it in a pipeline, which gives its lake's",
                )
            self._manifest = load(self.state) or capture(self.options, self.specs, self.state)
        return self._manifest

"""The Postgres source's probe: how far the WAL goes, and what the pipeline must do before it binds it.

Run on the driver, a probe (:meth:`PostgresProbe.probe`, the source's
:class:`~reclock.sources.base.AsksFirst`) returns one :class:`~reclock.sources.base.Probe` at a time:

1. the first probe with no manifest captures the snapshot (:func:`~reclock.sources.postgres.snapshot.capture`):
   it creates the slot, holds its exported snapshot open in a
   :class:`~reclock.sources.postgres.snapshot.Capture`, and asks the pipeline to land the chunks
   ahead of their binding (:class:`~reclock.sources.base.LandFirst`); the answer says the landing
   is durable in the pipeline's state, and only then does the snapshot go and the manifest get
   written;
2. a table that joined the publication, or came back to it, is copied at a consistent point of its
   own (:mod:`~reclock.sources.postgres.joining`), its chunks copied by the pipeline's tasks
   (:class:`~reclock.sources.base.RunFirst`), one table per probe; tables that left it are
   recorded (:mod:`~reclock.sources.postgres.leaving`);
3. then the probe reports the server's WAL flush position, read after every copy, with each
   copy's partition (:class:`~reclock.sources.base.Probe` ``upper``).

A probe with no answer while a request waits gives the request up: the snapshot goes, and the
next probe starts that capture or copy over. :meth:`PostgresProbe.upper`, for a caller without a
pipeline, does the pipeline's part itself (every chunk copied into a file here).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reclock.errors import ConfigError, ContractError
from reclock.sources.base import Answer, LandFirst, Probe, RunFirst
from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.clients import connect, server_errors
from reclock.sources.postgres.config import PostgresOptions, TableName
from reclock.sources.postgres.joining import JoinCapture, Joined, capture_join, published
from reclock.sources.postgres.leaving import Left, record_left
from reclock.sources.postgres.pgoutput import lsn_text, parse_lsn
from reclock.sources.postgres.snapshot import (
    Capture,
    Chunk,
    ChunkOffset,
    ChunkTask,
    Manifest,
    capture,
    copy_chunk,
    load,
)
from reclock.sources.state import StateFolder
from reclock.timeline.frontier import Frontier

__all__ = ["WAL", "ChunkSplit", "PostgresProbe"]

log = logging.getLogger("reclock.sources.postgres")

#: The source's one partition: the database's write-ahead log, in commit LSNs.
WAL = "wal"


@dataclass(frozen=True)
class ChunkSplit(ChunkOffset):
    """One snapshot chunk (offset ``start`` = the chunk's index): read from the exported snapshot
    by its ``copy`` while it is landed ahead, from its file when captured into one."""

    copy: ChunkTask | None = None


class PostgresProbe:
    """The probe of :class:`~reclock.sources.postgres.source.PostgresSource`, which sets these
    attributes (the module docstring says what it does)."""

    options: PostgresOptions
    state: StateFolder | None
    #: The initial tables, the tables joined since, and those an explicit list names that must join.
    specs: tuple[TableSpec, ...]
    joins: tuple[Joined, ...]
    _named_later: tuple[TableName, ...]
    #: Removals from the publication (:mod:`~reclock.sources.postgres.leaving`), as noticed.
    leaves: tuple[Left, ...]
    _manifest: Manifest | None
    #: The capture whose probe waits for the pipeline's answer (driver-side: it holds the
    #: connection that exported its snapshot; never pickled).
    _waiting: Capture | JoinCapture | None

    def upper(self) -> Frontier:
        """:meth:`probe`'s upper, for a caller without a pipeline: what the probe asks the
        pipeline to do is done here, the snapshot's chunks and each joining table's copied into
        chunk files (read back by the batches) by this process."""
        probe = self._probe(None, lands=False)
        while probe.run_first is not None:
            work = probe.run_first
            probe = self._probe(Answer(ran=tuple(work.fn(item) for item in work.items)), lands=False)
        assert probe.upper is not None, "a probe that lands nothing ahead asks at most for copies"
        return probe.upper

    def probe(self, answer: Answer | None) -> Probe:
        """The server's WAL flush position (:class:`~reclock.sources.base.AsksFirst`). The first
        probe captures the snapshot if none is: it asks the pipeline to land the chunks ahead
        (:class:`~reclock.sources.base.LandFirst`), the snapshot exported until the answer says
        the landing is durable. Every probe copies the tables that joined the publication since
        the last, or came back to it (:mod:`~reclock.sources.postgres.joining`,
        :mod:`~reclock.sources.postgres.leaving`), one at a time, by the pipeline's tasks
        (:class:`~reclock.sources.base.RunFirst`): each copy is a partition of its own, reported
        with a WAL upper past its consistent point (the flush position is read after it)."""
        return self._probe(answer, lands=True)

    def _probe(self, answer: Answer | None, *, lands: bool) -> Probe:
        self._answered(answer)
        if self._manifest is None:
            self._load()
        if self._manifest is None:
            asked = self._capture(lands)
            if asked is not None:
                return asked
        assert self._manifest is not None
        conn = connect(self.options.dsn, timeout_s=self.options.read_timeout_s)
        try:
            with server_errors(self.options.slot, self.options.publication), conn.cursor() as cur:
                listed = published(cur, self.options.publication) if self.options.whole_publication else None
                joining = self._joining(listed or [])
                back = self._follow_removals(cur, listed) if listed is not None else []
        finally:
            conn.close()
        if joining or back:
            table, rejoin = (joining[0], 0) if joining else (back[0].table, back[0].returns + 1)
            copy = self._join(table, rejoin)
            self._waiting = copy
            return Probe(run_first=RunFirst(copy_chunk, tuple(copy.tasks)))
        conn = connect(self.options.dsn, timeout_s=self.options.read_timeout_s)
        try:
            with server_errors(self.options.slot, self.options.publication), conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_flush_lsn()")
                flushed = parse_lsn(cur.fetchone()[0])
        finally:
            conn.close()
        wal = max(flushed, self._manifest.consistent_lsn, *(j.consistent_lsn for j in self.joins))
        return Probe(upper=Frontier({WAL: wal, **{j.partition: j.upper for j in self.joins}}))

    def _capture(self, lands: bool) -> Probe | None:
        """Start the snapshot's capture at a new slot: what the pipeline must do for it (land its
        chunks ahead, or, ``lands`` false, copy them), or ``None`` when it has no chunk to take."""
        assert self.state is not None, "_load refuses a source without a state folder"
        started = capture(
            self.options.dsn,
            self.options.slot,
            self.options.publication,
            self.specs,
            self.state,
            take=self.options.snapshot,
            chunk_pages=self.options.snapshot_chunk_pages,
        )
        if not started.tasks:
            self._manifest = started.copied([])
            return None
        self._waiting = started
        if not lands:
            return Probe(run_first=RunFirst(copy_chunk, tuple(started.tasks)))
        consistent = started.consistent_lsn
        splits = tuple(
            ChunkSplit(WAL, t.index, t.index + 1, Chunk(t.spec.output, "", t.rows), consistent, copy=t)
            for t in started.tasks
        )
        return Probe(land_first=LandFirst(Frontier({WAL: consistent}), splits))

    def _answered(self, answer: Answer | None) -> None:
        """Finish the capture or the copy the last probe asked the pipeline about, with its
        ``answer``: its manifest, last and whole. No answer: the pipeline gave the request up (it
        failed, or a new driver probes), and the snapshot goes; the next capture starts over."""
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            if answer is not None:
                raise ContractError("the pipeline answered a probe of the Postgres source that asked for nothing")
            return
        if answer is None:
            waiting.abandon()
            return
        if isinstance(waiting, Capture):
            if answer.landed is not None:
                self._manifest = waiting.landed(answer.landed)
            else:
                self._manifest = waiting.copied(answer.ran or ())
            return
        joined = waiting.copied(answer.ran or ())
        self.joins = (*self.joins, joined)
        log.info(
            "table %s %s the publication: %d rows copied at LSN %s, output %s",
            joined.spec.table.qualified,
            "came back to" if joined.rejoin else "joined",
            sum(c.rows for c in joined.chunks),
            lsn_text(joined.consistent_lsn),
            joined.spec.output,
        )

    def _joining(self, listed: Sequence[TableName]) -> list[TableName]:
        """The tables the definition selects now (``listed``: the publication's, with ``"*"``)
        that are neither initial nor joined yet."""
        have = {s.table for s in self._read_specs}
        return sorted({t for t in (*self._named_later, *listed) if t not in have})

    def _away(self) -> dict[str, Left]:
        """The outputs whose table is out of the publication now: its last removal, not yet
        followed by a return."""
        returns: dict[str, int] = {}
        for j in self.joins:
            returns[j.spec.output] = max(returns.get(j.spec.output, 0), j.rejoin)
        return {left.output: left for left in self.leaves if left.returns == returns.get(left.output, 0)}

    def _follow_removals(self, cur: Any, listed: Sequence[TableName]) -> list[Left]:
        """Record each table read that left the publication, at the WAL insert position read
        after ``listed`` (:mod:`~reclock.sources.postgres.leaving`); the removals of those that
        are back, to be copied again. A table ``tables`` names is the definition's own, added by
        the source."""
        now = set(listed)
        away = self._away()
        back = []
        for spec in self._read_specs:
            left = away.get(spec.output)
            if spec.table in now:
                if left is not None:
                    back.append(left)
                continue
            if left is not None or spec.table in self.options.tables:
                continue
            cur.execute("SELECT pg_current_wal_insert_lsn()")
            returns = sum(1 for j in self.joins if j.spec.output == spec.output and j.rejoin)
            left = Left(spec.table, spec.output, parse_lsn(cur.fetchone()[0]), returns)
            record_left(self.state, left)
            self.leaves = (*self.leaves, left)
            log.warning(
                "table %s left publication %s: output %s keeps its rows and stops at LSN %s",
                spec.table.qualified,
                self.options.publication,
                spec.output,
                lsn_text(left.lsn),
            )
        return back

    def warnings(self) -> Sequence[str]:
        """The tables out of the publication now (``reclock status`` shows them)."""
        return [
            f"table {left.table.qualified} left publication {self.options.publication}: "
            f"output {left.output} stopped at LSN {lsn_text(left.lsn)}"
            for left in self._away().values()
        ]

    def _join(self, table: TableName, rejoin: int = 0) -> JoinCapture:
        """Start copying a joining table, or one back in the publication (its ``rejoin``-th return,
        whose copy must be of its output's columns): :func:`~reclock.sources.postgres.joining.capture_join`.
        It is read from its manifest on, its changes below the copy dropped."""
        assert self.state is not None, "tables join only once the snapshot is captured, in the state folder"
        output = next((s for s in self._read_specs if s.table == table), None) if rejoin else None
        return capture_join(
            self.options.dsn,
            self.options.slot,
            self.options.publication,
            self.options.envelope,
            table,
            self.state,
            chunk_pages=self.options.snapshot_chunk_pages,
            rejoin=rejoin,
            output_spec=output,
        )

    def _load(self) -> None:
        """The snapshot's manifest from the state folder, if one of this slot is there."""
        if self.state is None:
            raise ConfigError(
                "state_dir",
                "the source keeps its slot's snapshot in a folder every task reaches: "
                "give state_dir (a path or an s3:// URI), or run it in a pipeline, which gives its lake's",
            )
        kept = load(self.state)
        if kept is not None and kept.slot == self.options.slot:
            self._manifest = kept

    def _captured(self) -> Manifest:
        """The slot and the snapshot's manifest (by the driver and its tasks): read on first need,
        captured here if there is none yet (a source asked for splits before any probe)."""
        if self._manifest is None:
            self._load()
        if self._manifest is None:
            self.upper()
        assert self._manifest is not None
        return self._manifest

    @property
    def _read_specs(self) -> tuple[TableSpec, ...]:
        """The tables a reader reads: the initial ones and those joined (a return reads its
        output's spec, which its copy's columns are, :func:`~reclock.sources.postgres.leaving.replaces`)."""
        return (*self.specs, *(j.spec for j in self.joins if not j.rejoin))

    def close(self) -> None:
        """Let go of a capture still waiting for the pipeline (every stage opens and closes its
        own connections)."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.abandon()

"""An independent reader of reclock's lake: the Delta log parsed by hand, the reclock rule re-derived.

The fault tests must not trust the code they test, so nothing here imports ``persist`` or
``reclock``: a table's live files come from replaying its ``_delta_log`` (the newest parquet
checkpoint, then the JSON commits after it), the rows from reading those files with pyarrow, an
output's label from its ``txn`` actions, and a row's expected ``_into_ts`` from the remap table's
rows with the rule of the design restated here: record ``(p, o)`` belongs to the least binding time
``T`` whose frontier ``R(T)`` has ``o < R(T)[p]``, where ``R(T)[p]`` is the largest offset any
binding at or before ``T`` recorded for ``p`` (a closed binding covers everything).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DeltaLog", "Remap", "checkpoint_agrees", "label_of", "read_rows"]

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} in a Delta log entry is not JSON: strict readers cannot open the table")


@dataclass
class DeltaLog:
    """The live state of one Delta table, brought up to date by :meth:`refresh`.

    Commit files are immutable once they exist, so a refresh only parses the versions it has not
    seen: cheap enough to poll every 100 ms while a job writes. The first refresh replays from
    version 0 when the whole log is there, else from the newest checkpoint (log cleanup removed,
    or was removing, older commits); ``from_checkpoint`` forces the latter, which is how a real
    reader starts and what :func:`checkpoint_agrees` compares against a full replay. A commit
    missing *after* the starting point is a broken table and fails the refresh.
    """

    path: Path
    from_checkpoint: bool = False
    version: int = -1
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)

    def refresh(self) -> DeltaLog:
        log = self.path / "_delta_log"
        if not log.is_dir():
            return self
        names = [p.name for p in log.iterdir()]
        commits = sorted(int(m.group(1)) for m in map(_COMMIT.match, names) if m)
        if self.version < 0:
            checkpoints = sorted({int(m.group(1)) for m in map(_CHECKPOINT.match, names) if m})
            # Log cleanup deletes the commits below a checkpoint in no particular order, and may be
            # interrupted: replay from version 0 only while every commit up to the checkpoint is
            # there, as a real reader would start from the checkpoint anyway.
            complete = checkpoints and set(range(checkpoints[-1] + 1)) <= set(commits)
            if checkpoints and (self.from_checkpoint or not complete):
                self._load_checkpoint(log, checkpoints[-1], names)
        newer = [c for c in commits if c > self.version]
        if self.version >= 0 and newer and newer[0] != self.version + 1:
            # Cleanup removed commits this reader had not read yet, below a newer checkpoint: a
            # real reader reloads from that checkpoint. Without one, the gap is a broken table.
            checkpoints = sorted({int(m.group(1)) for m in map(_CHECKPOINT.match, names) if m})
            ahead = [c for c in checkpoints if self.version < c and c + 1 >= newer[0]]
            if ahead:
                self.files, self.txns = {}, {}
                self._load_checkpoint(log, ahead[-1], names)
        for version in commits:
            if version <= self.version:
                continue
            if version != self.version + 1:
                raise AssertionError(f"{log}: commit {version} follows {self.version}: the log has a gap")
            for line in (log / f"{version:020d}.json").read_text().splitlines():
                if line.strip():
                    self._apply(json.loads(line, parse_constant=_not_json))
            self.version = version
        return self

    def uris(self) -> list[str]:
        return [self._local(p) for p in sorted(self.files)]

    def _load_checkpoint(self, log: Path, version: int, names: list[str]) -> None:
        prefix = f"{version:020d}.checkpoint"
        for name in sorted(n for n in names if n.startswith(prefix) and n.endswith(".parquet")):
            for row in pq.read_table(log / name).to_pylist():
                self._apply({k: v for k, v in row.items() if v is not None})
        self.version = version

    def _apply(self, action: dict[str, Any]) -> None:
        if "add" in action:
            self.files[unquote(action["add"]["path"])] = action["add"]
        elif "remove" in action:
            self.files.pop(unquote(action["remove"]["path"]), None)
        elif "txn" in action:
            txn = action["txn"]
            self.txns[txn["appId"]] = max(self.txns.get(txn["appId"], -1), int(txn["version"]))

    def _local(self, path: str) -> str:
        if "://" in path:
            return urlparse(path).path
        return str(self.path / path)


def read_rows(log: DeltaLog, columns: list[str] | None = None) -> pa.Table | None:
    """The table's rows at the log's version (``None`` before its first commit)."""
    uris = log.uris()
    if log.version < 0:
        return None
    if not uris:
        return pa.table({c: [] for c in columns or []})
    pieces = [_without_views(pq.read_table(u, columns=columns)) for u in uris]
    return pa.concat_tables(pieces, promote_options="default")


def _without_views(table: pa.Table) -> pa.Table:
    """``table`` with its view columns as plain ones: delta-rs's MERGE writes ``string_view`` and
    ``binary_view``, and a table one wrote (reclock's outputs before reclock wrote its MERGEs
    itself) may hold both kinds of file (a Delta reader reads them all by the table's schema)."""
    plain = pa.schema([f.with_type(_plain(f.type)) for f in table.schema], metadata=table.schema.metadata)
    return table if plain == table.schema else table.cast(plain)


def _plain(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_struct(kind):
        return pa.struct([kind.field(i).with_type(_plain(kind.field(i).type)) for i in range(kind.num_fields)])
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_plain(kind.value_type)))
    return kind


def label_of(log: DeltaLog, app_id: str) -> int | None:
    """The newest transaction label ``app_id`` committed (the binding time an output holds)."""
    return log.txns.get(app_id)


def checkpoint_agrees(path: Path) -> bool | None:
    """Whether the newest checkpoint plus later commits gives the live files a full replay does
    (``None`` when the table has no checkpoint, so there is nothing to compare)."""
    log = path / "_delta_log"
    if not any(_CHECKPOINT.match(p.name) for p in log.iterdir()):
        return None
    full = DeltaLog(path).refresh()
    from_checkpoint = DeltaLog(path, from_checkpoint=True).refresh()
    return full.version == from_checkpoint.version and set(full.files) == set(from_checkpoint.files)


class Remap:
    """The bindings of a remap table's rows, and the reclock rule over them.

    Rows are ``(into_ts, partition, offset, closed, skip_start, note)``; a row with ``skip_start``
    set records a skipped range, not a binding, or, when its note begins ``redrive``, records
    ``[skip_start, offset)`` that land again at ``into_ts`` (a redrive of ``_errors``; the note
    names the outputs after a space, comma-separated, or none for all). Partitions stay as the
    encoded strings the output rows carry in ``_partition``, so no decoding is involved in the
    comparison. Rows noted ``compacted`` are the binding at the table's ``since`` that merged
    every earlier one: a record it covers was stamped at ``since`` or before, which
    :meth:`stamp_holds` accepts.
    """

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        ranges = [r for r in rows if r["skip_start"] is not None]
        self.redrives = [r for r in ranges if (r["note"] or "").split(" ")[0] == "redrive"]
        self.skips = [r for r in ranges if r not in self.redrives]
        bindings = sorted((r for r in rows if r["skip_start"] is None), key=lambda r: r["into_ts"])
        self.since = max((r["into_ts"] for r in bindings if r.get("note") == "compacted"), default=None)
        self.times = sorted({r["into_ts"] for r in bindings})
        self.closed_at = min((r["into_ts"] for r in bindings if r["closed"]), default=None)
        self._uppers: dict[str, tuple[list[int], list[int]]] = {}
        for r in bindings:
            if r["partition"] is None:
                continue
            uppers, times = self._uppers.setdefault(r["partition"], ([], []))
            if not uppers or r["offset"] > uppers[-1]:
                uppers.append(r["offset"])
                times.append(r["into_ts"])

    @classmethod
    def read(cls, path: Path) -> Remap:
        table = read_rows(DeltaLog(path).refresh())
        return cls(table.to_pylist() if table is not None else [])

    def stamp(self, partition: str, offset: int) -> int | None:
        """The least binding time whose frontier covers ``(partition, offset)``; ``None`` if none."""
        uppers, times = self._uppers.get(partition, ([], []))
        i = bisect_right(uppers, offset)
        if i < len(uppers):
            return times[i]
        return self.closed_at

    def stamp_holds(self, partition: str, offset: int, into_ts: int) -> bool:
        """Whether a row's ``_into_ts`` is the one these bindings give it (compaction allowed)."""
        want = self.stamp(partition, offset)
        if want is not None and want == self.since:
            return into_ts <= want
        return into_ts == want

    def redriven_at(self, partition: str, offset: int) -> list[int]:
        """The into times redrives landed ``(partition, offset)`` at, oldest first."""
        return sorted(
            r["into_ts"]
            for r in self.redrives
            if r["partition"] == partition and r["skip_start"] <= offset < r["offset"]
        )

    def frontier_at(self, time: int) -> dict[str, int]:
        """``R(time)``: per partition, the first offset not covered by a binding at or before ``time``."""
        out = {}
        for partition, (uppers, times) in self._uppers.items():
            i = bisect_right(times, time)
            if i:
                out[partition] = uppers[i - 1]
        return out

    def is_closed_at(self, time: int) -> bool:
        return self.closed_at is not None and self.closed_at <= time

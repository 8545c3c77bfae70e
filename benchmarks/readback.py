"""Reading back what a contender wrote: the commits of its Delta tables, and its rows' coordinates.

Scenarios judge reclock and its baselines by what landed in the tables, not by their own reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["Commit", "assert_exactly_once", "delta_commits"]


@dataclass(frozen=True)
class Commit:
    """One version of a Delta table, read from its log file."""

    version: int
    visible_s: float  # mtime of the log file: the moment the commit became visible to readers
    commit_ms: int | None  # commitInfo.timestamp
    rows: int
    files: tuple[str, ...] = field(default=())


def delta_commits(table: str | Path, after: int = -1) -> list[Commit]:
    """The commits of a Delta table with version > ``after``, from ``_delta_log/*.json``.

    Read straight from the log (the Delta protocol: one JSON action per line), so no reader
    library sits between the commit and what we measure.
    """
    log = Path(table) / "_delta_log"
    out = []
    for path in sorted(log.glob("*.json")):
        version = int(path.stem)
        if version <= after:
            continue
        rows, files, commit_ms = 0, [], None
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                files.append(add["path"])
                stats = add.get("stats")
                rows += json.loads(stats)["numRecords"] if stats else 0
            elif "commitInfo" in action:
                commit_ms = action["commitInfo"].get("timestamp")
        out.append(Commit(version, path.stat().st_mtime, commit_ms, rows, tuple(files)))
    return out


def assert_exactly_once(lake: Any, pipeline: str, records: int) -> None:
    """Every source record is in exactly one output row: ``records`` distinct coordinates in all."""
    from deltalake import DeltaTable

    from reclock.persist.read import read_table

    seen = 0
    keys = []
    for output in lake.outputs(pipeline):
        table = read_table(DeltaTable(str(lake.output_path(pipeline, output))), columns=["_partition", "_offset"])
        seen += table.num_rows
        keys.append(table)
    combined = pa.concat_tables(keys)
    distinct = combined.group_by(["_partition", "_offset"]).aggregate([]).num_rows
    assert distinct == seen == records, f"{pipeline}: {seen} rows, {distinct} distinct records, {records} expected"

"""An independent Delta reader for acceptance checks: the log parsed by hand, files read by pyarrow.

Nothing here uses the project's read path or delta-rs: it replays ``_delta_log`` (from the last
checkpoint, if any, then every JSON commit after it) into the set of live files, and reads those
with pyarrow. A defect in how reclock writes or reads its tables cannot hide behind it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["live_files", "read_delta", "transaction_versions"]


def _strict(constant: str) -> None:
    raise ValueError(f"non-JSON number {constant} in a Delta log entry")


def _actions(table: Path) -> list[dict]:
    """Every action since the last checkpoint (checkpoint rows first), in version order."""
    log = table / "_delta_log"
    actions: list[dict] = []
    after = -1
    last = log / "_last_checkpoint"
    if last.exists():
        after = json.loads(last.read_text())["version"]
        parts = sorted(log.glob(f"{after:020d}.checkpoint*.parquet"))
        for row in pq.read_table(parts).to_pylist():
            actions += [{key: value} for key, value in row.items() if value is not None]
    for commit in sorted(log.glob("*.json")):
        if int(commit.name.split(".")[0]) > after:
            actions += [json.loads(line, parse_constant=_strict) for line in commit.read_text().splitlines()]
    return actions


def live_files(table: Path) -> list[str]:
    """Paths (relative to the table) of the files the table's latest version holds."""
    files: dict[str, None] = {}
    for action in _actions(table):
        if "add" in action:
            files[action["add"]["path"]] = None
        elif "remove" in action:
            files.pop(action["remove"]["path"], None)
    return list(files)


def transaction_versions(table: Path) -> dict[str, int]:
    """The latest ``txn`` version per app id: the labels reclock commits carry."""
    out: dict[str, int] = {}
    for action in _actions(table):
        if "txn" in action:
            out[action["txn"]["appId"]] = action["txn"]["version"]
    return out


def read_delta(table: Path) -> pa.Table:
    """The rows of the table's latest version (an empty table, no columns, when it holds no file)."""
    files = [str(table / path) for path in live_files(table)]
    return pq.read_table(files) if files else pa.table({})

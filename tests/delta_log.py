"""An outside reader of Delta tables for acceptance tests: the ``_delta_log`` JSON replayed by
hand and the data files read with pyarrow, sharing no code with reclock or delta-rs's reader.

It follows the protocol's plain parts only (JSON commits, no checkpoints, no deletion vectors),
which is all the tables these tests write use.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


@dataclass
class LogState:
    """A table's state after replaying its log: live files, schema, partitioning and labels."""

    root: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> add action
    schema: list[dict[str, Any]] = field(default_factory=list)  # Delta schema fields
    partition_columns: list[str] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # app id -> txn version
    commits: list[list[dict[str, Any]]] = field(default_factory=list)  # actions of each version

    @property
    def column_names(self) -> list[str]:
        return [f["name"] for f in self.schema]

    def rows(self) -> list[dict[str, Any]]:
        """Every live row: a file's columns, plus its partition values as the log's text."""
        out = []
        for path, add in self.files.items():
            table = pq.read_table(self.root / urllib.parse.unquote(path))
            for row in table.to_pylist():
                row.update(add.get("partitionValues") or {})
                for name in self.column_names:
                    row.setdefault(name, None)
                out.append(row)
        return out


def replay(table_root: str | Path, *, version: int | None = None) -> LogState:
    """Replay ``_delta_log/*.json`` up to ``version`` (all by default)."""
    root = Path(table_root)
    state = LogState(root)
    entries = sorted((root / "_delta_log").glob("*.json"))
    for entry in entries:
        if version is not None and int(entry.stem) > version:
            break
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        state.commits.append(actions)
        for action in actions:
            if "add" in action:
                state.files[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                state.files.pop(action["remove"]["path"], None)
            elif "metaData" in action:
                state.schema = json.loads(action["metaData"]["schemaString"])["fields"]
                state.partition_columns = action["metaData"]["partitionColumns"]
            elif "txn" in action:
                state.labels[action["txn"]["appId"]] = action["txn"]["version"]
    return state

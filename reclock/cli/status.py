"""``reclock status``, ``batches``, ``errors`` and ``files``: what the lake says about its pipelines.

Kept beside :mod:`reclock.cli.main`, which registers the commands, so each command module stays small;
:func:`table` and :func:`when` format every table the CLI prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

import pyarrow as pa

from reclock.job import control, detach, lifecycle
from reclock.job.status import read_status
from reclock.persist.asof import CLOSED_UPPER, latest_cut, read_as_of, readable_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.read import read_table
from reclock.persist.status_tables import read_status_table
from reclock.runtime.pipeline import BatchState
from reclock.sources.base import ERRORS
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, label_upper

__all__ = ["agg", "as_of", "show_table", "status", "table", "when"]


_COLUMNS = {
    "batches": [
        "batch_id",
        "state",
        "partition",
        "rows",
        "filtered",
        "bytes",
        "earliest_offset",
        "latest_offset",
        "start_ms",
        "duration_ms",
        "read_ms",
        "commit_ms",
        "error",
    ],
    "files": ["path", "generation", "size", "state", "into_ts", "reason"],
    "errors": ["time_ms", "kind", "code", "message", "batch_id", "partition", "offset"],
}


def show_table(lake: Lake, args: argparse.Namespace) -> int:
    if args.table == "files":
        rows = [asdict(s) for s in lifecycle.file_states(lake, args.name)]  # derived from the lake, newest first
    else:
        lifecycle.load(lake, args.name)
        rows = read_status_table(lake, args.table, args.name).to_pylist()
        if args.table == "batches":
            rows = _settled(rows)
        if args.table == "errors":
            rows = sorted(rows + _record_errors(lake, args.name), key=lambda r: r["time_ms"] or 0)
        rows = rows[::-1]
    rows = rows[: args.limit or None]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    columns = _COLUMNS[args.table]
    print(table(columns, [[_cell(c, row.get(c)) for c in columns] for row in rows]))
    return 0


def _settled(rows: list[dict]) -> list[dict]:
    """Batch rows, oldest first, without an ``In Progress`` row once its batch has a later row."""
    last = {row["batch_id"]: i for i, row in enumerate(rows)}
    return [row for i, row in enumerate(rows) if row["state"] != BatchState.IN_PROGRESS or last[row["batch_id"]] == i]


def _record_errors(lake: Lake, name: str) -> list[dict]:
    """Rows of the pipeline's ``_errors`` output, shaped like the errors status table."""
    path = lake.output_path(name, ERRORS)
    if not lake.store.is_table(path):
        return []
    table = read_table(
        lake.store.open_table(path), columns=["kind", "message", PARTITION, OFFSET, INTO_TS], store=lake.store
    )
    return [
        {
            "time_ms": r[INTO_TS],
            "kind": r["kind"],
            "code": "record",
            "message": r["message"],
            "batch_id": r[INTO_TS],
            "partition": r[PARTITION],
            "offset": r[OFFSET],
        }
        for r in table.to_pylist()
    ]


def _cell(column: str, value: object) -> str:
    if value is None:
        return ""
    if column in ("start_ms", "time_ms") and isinstance(value, int):
        return when(value)
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return str(value)


def as_of(lake: Lake, args: argparse.Namespace) -> int:
    """Row counts of every output of ``names`` at one into time, refused past their joint upper."""
    for name in args.names:
        lifecycle.load(lake, name)
    at = latest_cut(lake, args.names) if args.at is None else args.at
    try:
        cut = read_as_of(lake, args.names, at)
    except ValueError as exc:
        print(f"reclock: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps({"as_of": at, "pipelines": {p: {o: t.num_rows for o, t in c.items()} for p, c in cut.items()}})
        )
        return 0
    print(f"consistent cut of {', '.join(args.names)} at into time {at} ({when(at)}):")
    rows = [
        [p, o, f"{t.num_rows:,}", when(agg(t, min)), when(agg(t, max))] for p, c in cut.items() for o, t in c.items()
    ]
    print(table(["pipeline", "output", "rows", "min _into_ts", "max _into_ts"], rows))
    return 0


def status(lake: Lake, args: argparse.Namespace) -> int:
    names = [args.name] if args.name else lake.pipelines()
    if args.name:
        lifecycle.load(lake, args.name)
    if not names and not lake.exists():
        raise control.missing_lake(lake)
    rows = [_pipeline_status(lake, name) for name in names]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no pipelines in {lake.root}")
        return 0
    print(
        table(
            ["pipeline", "health", "finished", "batches", "readable upper", "bindings", "last error"],
            [
                [
                    r["pipeline"],
                    r["health"],
                    "yes" if r["finished"] else "no",
                    r["batches"],
                    when(r["readable_upper"]),
                    r["bindings"],
                    r["unreadable"] or r["last_error"] or "",
                ]
                for r in rows
            ],
        )
    )
    for r in rows:
        for warning in r["warnings"]:
            print(f"warning: {r['pipeline']}: {warning}")
    for r in rows:
        print(f"\n{r['pipeline']} outputs:")
        print(
            table(
                ["output", "rows", "upper"],
                [[o, "?" if n is None else f"{n:,}", when(u)] for o, (n, u) in r["outputs"].items()],
            )
        )
    return 0


def _pipeline_status(lake: Lake, name: str) -> dict:
    """One pipeline's row; an output that cannot be read is named in ``unreadable``, not raised,
    so that one broken table does not hide the rest of the lake."""
    status = read_status(lake, name) or {}
    outputs: dict[str, tuple[int | None, int | None]] = {}
    problems = []
    for output in lake.outputs(name):
        try:
            outputs[output] = _output_status(lake, name, output)
        except Exception as exc:  # a corrupt or unreadable table: report it, go on with the others
            outputs[output] = (None, None)
            problems.append(f"cannot read output {output!r}: {_first_line(exc)}")
    upper = None
    if not problems:
        try:
            upper = readable_upper(lake, name)
        except Exception as exc:
            problems.append(f"cannot read the remap table: {_first_line(exc)}")
    return {
        "pipeline": name,
        "health": "detached" if detach.is_detached(lake, name) else status.get("health", "created"),
        "finished": status.get("finished", False),
        "batches": status.get("batches", 0),
        "bindings": status.get("bindings", 0),
        "readable_upper": upper,
        "resume_frontier": status.get("resume_frontier", "{}"),
        "last_error": status.get("last_error"),
        "last_maintenance": status.get("last_maintenance"),
        "warnings": status.get("warnings", []),
        "unreadable": "; ".join(problems) or None,
        "outputs": outputs,
    }


def _first_line(exc: Exception) -> str:
    """``Type: message`` without what follows its first line (delta-rs appends a backtrace)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _output_status(lake: Lake, name: str, output: str) -> tuple[int, int]:
    """Rows in the output's latest version and its upper (label + 1).

    Row counts come from each add action's statistics; a file committed without them (another
    writer may leave them out) is counted from its parquet footer instead.
    """
    root = lake.output_path(name, output)
    table = lake.store.open_table(root)
    label = table.transaction_version(sink_id(name, output))
    count = 0
    if table.file_uris():
        actions = pa.table(table.get_add_actions())
        for path, records in zip(
            actions.column("path").to_pylist(), actions.column("num_records").to_pylist(), strict=True
        ):
            count += records if records is not None else lake.store.parquet_rows(root / path)
    return count, label_upper(label)


def agg(table: pa.Table, fn) -> int | None:
    values = table.column(INTO_TS).to_pylist()
    return fn(values) if values else None


def when(ms: int | None) -> str:
    if not ms:
        return "-"
    if ms >= CLOSED_UPPER:
        return "closed (all times)"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

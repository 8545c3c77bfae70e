"""Detach, after SingleStore's ``DETACH PIPELINE``: stop loading and hand the outputs to the user.

``reclock detach`` (:func:`detach`) stops the job after its in-flight batch, then records what
each output table looks like: the columns reclock writes and their types, the partition columns, and the
label reclock last committed. The pipeline keeps its definition, remap table and state; the
user may now change its outputs. The next ``reclock start`` checks the tables against that
record before loading anything and continues exactly where the pipeline stopped, or refuses in
one line naming the output and what changed (:func:`attach`).

A user may, while detached: add nullable columns to an output (reclock's rows read back with
nulls there), compact, Z-order, vacuum or set table properties, and delete, update or overwrite
rows (their own business: reclock never re-reads an output; an overwrite that keeps the schema is
a new version of the same table, label included). A user may not: drop, rename or retype a column
reclock writes, add a column that is not nullable (reclock's appends could not satisfy it),
change the partition columns, or delete or recreate a table (its label is how a replay knows
what is already committed, so without it a restart could load a batch twice). The remap table
and ``_errors`` are reclock's own and are checked the same way.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from reclock.errors import ReclockError
from reclock.job.control import exclusive_after_stop, load
from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.store import LakePath

__all__ = ["attach", "detach", "is_detached"]


def detach(lake: Lake, name: str, *, wait_s: float = 60.0) -> LakePath:
    """Stop the pipeline if it runs (waiting up to ``wait_s``), then record its outputs."""
    load(lake, name)
    lease = exclusive_after_stop(lake, name, wait_s)
    try:
        outputs = {output: _snapshot(lake, name, output) for output in lake.outputs(name)}
        path = _marker(lake, name)
        lake.store.write_text(path, json.dumps({"outputs": outputs}))
        return path
    finally:
        lease.release()


def is_detached(lake: Lake, name: str) -> bool:
    return lake.store.exists(_marker(lake, name))


def attach(lake: Lake, name: str) -> None:
    """Before a start (the caller holds the job lock): refuse outputs changed incompatibly while
    the pipeline was detached, else end the detachment."""
    path = _marker(lake, name)
    if not lake.store.exists(path):
        return
    recorded = json.loads(lake.store.read_text(path))["outputs"]
    for output, was in recorded.items():
        problem = _incompatible(lake, name, output, was)
        if problem is not None:
            raise ReclockError(
                f"pipeline {name!r} cannot start: output {output!r} {problem} while detached; "
                "undo that change (see reclock detach in docs/operations.md)"
            )
    lake.store.delete(path)


def _marker(lake: Lake, name: str) -> LakePath:
    return lake.control_dir(name) / "detached.json"


def _snapshot(lake: Lake, name: str, output: str) -> dict[str, Any]:
    table = lake.store.open_table(lake.output_path(name, output))
    schema = _arrow_schema(table)
    return {
        "label": output_upper(lake.output_path(name, output), sink_id(name, output), lake.store),
        "partition_columns": list(table.metadata().partition_columns),
        "columns": {f.name: str(f.type) for f in schema},
    }


def _incompatible(lake: Lake, name: str, output: str, was: dict[str, Any]) -> str | None:
    """What makes ``output`` unusable for the pipeline now, or ``None``."""
    path = lake.output_path(name, output)
    if not lake.store.is_table(path):
        return "was deleted"
    table = lake.store.open_table(path)
    if output_upper(path, sink_id(name, output), lake.store) < was["label"]:
        return "was replaced or recreated (reclock's commit label is gone)"
    if list(table.metadata().partition_columns) != was["partition_columns"]:
        return f"changed its partition columns from {was['partition_columns']} to {table.metadata().partition_columns}"
    now = {f.name: f for f in _arrow_schema(table)}
    for column, kind in was["columns"].items():
        if column not in now:
            return f"lost column {column!r}"
        if str(now[column].type) != kind:
            return f"changed column {column!r} from {kind} to {now[column].type}"
    added = [f.name for f in now.values() if f.name not in was["columns"] and not f.nullable]
    if added:
        return f"gained column {added[0]!r}, which is not nullable"
    return None


def _arrow_schema(table: Any) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())

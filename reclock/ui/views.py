"""The JSON each panel of the status page draws, shaped from one :class:`~reclock.ui.lake_view.Snapshot`.

* :func:`overview`: a row per pipeline: state (with the error and a hint when it needs a hand),
  freshness (now minus the readable upper), lag, rows/s in and committed, the last batch;
* :func:`series`: a pipeline's charts over time, as Spark's Structured Streaming tab draws them:
  input rate against process (commit) rate, rows per batch, batch duration by phase, lag per
  partition, freshness;
* :func:`timeline`: every output's upper and every pipeline's readable upper on one time axis, the
  joint cut of the selected pipelines (:func:`~reclock.persist.asof.latest_cut`'s answer, from the
  same uppers), who holds it back, and how to read that cut;
* :func:`table`: the batches, errors, files and offsets tables, filtered and a page at a time.

Rates follow Spark's ``StreamingQueryProgress``: a batch's *input rate* is its rows over the time
since the previous batch ended, its *process rate* its rows over its own duration (the sum of its
phases). A batch's rows are summed over its splits; a batch retried after a failure counts once,
as its final attempt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from reclock.job.file_states import FileStatus
from reclock.persist.asof import CLOSED_UPPER
from reclock.persist.status_tables import STATUS_SCHEMAS
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION
from reclock.ui.lake_view import PipelineState, Snapshot

__all__ = ["HINTS", "PHASES", "overview", "series", "state_of", "table", "timeline"]

#: The phases of a batch, in the order they run, as the batches table names them (``<phase>_ms``).
PHASES = ("probe", "mint", "plan", "read", "commit", "maintenance")

#: What an operator does about each state (docs/operations.md, "Health").
HINTS = {
    "created": "defined, never started: reclock start NAME",
    "starting": "the job started and no batch has succeeded yet; Spark start-up takes about 10 s",
    "running": "nothing to do: watch lag and freshness",
    "degraded": (
        "every record of the last batch went to _errors, nothing is lost: reclock errors NAME, fix the "
        "definition (reclock create --replace), restart, then reclock redrive NAME"
    ),
    "stalled": "a batch is retried with backoff, nothing is lost; read the error and reclock errors NAME",
    "failed": "fix the cause, then reclock start NAME: the restart catches up",
    "stopped": "the job ended cleanly; reclock start NAME continues",
    "finished": "the source ended and everything is in",
    "detached": "its outputs are yours until the next reclock start NAME",
    "dead": "the job ended without a final word (killed?); reclock start NAME resumes",
}

#: Batches a chart shows at most (the newest).
CHART_BATCHES = 300
#: Partitions the lag chart shows: the ones with the most lag now.
TOP_PARTITIONS = 8


def state_of(p: PipelineState) -> str:
    """The page's word for a pipeline: its health, ``finished`` for a stopped finished one,
    ``detached`` while detached, ``created`` before its first start."""
    if p.detached:
        return "detached"
    health = str(p.status.get("health", "created"))
    return "finished" if health == "stopped" and p.status.get("finished") else health


def overview(snap: Snapshot) -> dict[str, Any]:
    return {
        "taken_ms": snap.taken_ms,
        "refresh_ms": snap.duration_ms,
        "pipelines": [_overview_row(snap, p) for p in snap.pipelines.values()],
    }


def _overview_row(snap: Snapshot, p: PipelineState) -> dict[str, Any]:
    state = state_of(p)
    batches = _batches(snap, p.name, 2)
    last = batches[-1] if batches else None
    lags = _latest_lags(snap, p.name)
    # Any state's last error, a stopped or finished job's too: the final word of a job that
    # ended stays on the page until the next start replaces it (as on the CLI).
    error = "; ".join(p.problems) or p.status.get("last_error") or None
    return {
        "name": p.name,
        "source": p.source_kind,
        "engine": p.definition.get("pipeline", {}).get("engine"),
        "state": state,
        "health": p.status.get("health", "created"),
        "finished": p.finished,
        "error": error,
        "hint": HINTS.get(state, "").replace("NAME", p.name),
        "readable_upper": p.readable_upper,
        "freshness_ms": _freshness(snap.taken_ms, p.readable_upper),
        "lag": sum(lags.values()) if lags else None,
        "rows_in_per_s": last["input_rate"] if last else None,
        "rows_committed_per_s": last["process_rate"] if last else None,
        "last_batch": last,
        "batches": p.status.get("batches", 0),
        "bindings": p.status.get("bindings", 0),
        "updated_ms": p.status.get("updated_ms"),
        "outputs": {o: [s.rows, s.upper] for o, s in p.outputs.items()},
    }


def _freshness(now: int, upper: int | None) -> int | None:
    """Now minus the readable upper; 0 once finished (every cut is readable), none before a commit."""
    if upper is None or upper == 0:
        return None
    return 0 if upper == CLOSED_UPPER else max(0, now - upper)


def series(snap: Snapshot, name: str) -> dict[str, Any]:
    """A pipeline's charts: each is ``{"t": [seconds], <series>: [values]}``, oldest first."""
    p = snap.pipelines.get(name)
    if p is None:
        raise KeyError(name)
    batches = [b for b in _batches(snap, name, CHART_BATCHES) if b["state"] != "In Progress"]
    t = [b["end_ms"] / 1000 for b in batches]
    rates = {"t": t, "input": [b["input_rate"] for b in batches], "process": [b["process_rate"] for b in batches]}
    phases = {"t": t, **{phase: [b["phases"].get(phase) or 0 for b in batches] for phase in PHASES}}
    fresh_t, uppers = [], []
    for b in batches:
        if b["state"] in ("Succeeded", "No Data"):  # every output's commit of it is in: upper = id + 1
            fresh_t.append(b["end_ms"])
            uppers.append(b["batch_id"] + 1)
    if p.readable_upper:  # the live point: what the lake says now
        fresh_t.append(snap.taken_ms)
        uppers.append(p.readable_upper)
    freshness = {
        "t": [ms / 1000 for ms in fresh_t],
        "freshness": [_seconds(_freshness(ms, u)) for ms, u in zip(fresh_t, uppers, strict=True)],
        "readable_upper": uppers,
    }
    return {
        "pipeline": name,
        "taken_ms": snap.taken_ms,
        "rates": rates,
        "rows": {"t": t, "rows": [b["rows"] for b in batches]},
        "phases": phases,
        "lag": _lag_series(snap, name),
        "freshness": freshness,
    }


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _rows_of(snap: Snapshot, table: str, name: str) -> pa.Table:
    """The pipeline's rows of a status table, oldest first (empty if it has none)."""
    rows = snap.tables.get(table, {}).get(name)
    return rows if rows is not None else STATUS_SCHEMAS[table].empty_table()


def _batches(snap: Snapshot, name: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` batches, oldest first, one dict each: its final attempt's state, rows
    summed over splits, phases, end time (when its rows were recorded) and Spark's two rates."""
    rows = _rows_of(snap, "batches", name)
    if rows.num_rows == 0:
        return []
    # The rows of the newest ``limit`` attempts (each has one time_ms, however many splits it has).
    times = pc.unique(rows.column("time_ms"))
    tail = rows if len(times) <= limit else rows.filter(pc.greater_equal(rows.column("time_ms"), times[-limit]))
    columns = ["batch_id", "state", "rows", "time_ms", *(f"{phase}_ms" for phase in PHASES)]
    batches: dict[int, dict[str, Any]] = {}
    for r in tail.select(columns).to_pylist():
        # The rows of one attempt are appended together, with one time_ms: a row with another
        # time_ms is a later attempt (the retry after a failure, or the end of an In Progress).
        b = batches.get(r["batch_id"])
        if b is None or b["end_ms"] != r["time_ms"]:
            batches.pop(r["batch_id"], None)
            b = batches[r["batch_id"]] = {"batch_id": r["batch_id"], "state": r["state"], "rows": 0}
            b["end_ms"] = r["time_ms"]
            b["phases"] = {phase: r[f"{phase}_ms"] for phase in PHASES}
        b["rows"] += r["rows"] or 0
    ordered = sorted(batches.values(), key=lambda b: b["end_ms"])[-limit:]
    previous = None
    for b in ordered:
        if b["state"] == "In Progress":
            b.update(duration_ms=None, process_rate=None, input_rate=None)
            continue
        duration = sum(v or 0 for v in b["phases"].values())
        b["duration_ms"] = duration
        b["process_rate"] = round(b["rows"] * 1000 / duration, 1) if duration else None
        gap = b["end_ms"] - previous if previous is not None else None
        b["input_rate"] = round(b["rows"] * 1000 / gap, 1) if gap else None
        previous = b["end_ms"]
    return ordered


def _latest_lags(snap: Snapshot, name: str) -> dict[str, int]:
    """Per partition, the source's upper at the last probe less what every output holds, from each
    partition's newest ``offsets`` row (rows written before ``source_latest`` existed say nothing)."""
    rows = _rows_of(snap, "offsets", name).select(["partition", "latest_loaded", "source_latest"])
    rows = rows.filter(pc.and_(pc.is_valid(rows.column("source_latest")), pc.is_valid(rows.column("latest_loaded"))))
    if rows.num_rows == 0:
        return {}
    newest = rows.group_by("partition", use_threads=False).aggregate(
        [("latest_loaded", "last"), ("source_latest", "last")]
    )
    return {
        part: max(0, latest - loaded)
        for part, loaded, latest in zip(
            newest.column("partition").to_pylist(),
            newest.column("latest_loaded_last").to_pylist(),
            newest.column("source_latest_last").to_pylist(),
            strict=True,
        )
    }


def _lag_series(snap: Snapshot, name: str) -> dict[str, Any]:
    """Lag per partition at each ``offsets`` write, the :data:`TOP_PARTITIONS` largest now."""
    rows = _rows_of(snap, "offsets", name)
    if rows.num_rows == 0:
        return {"t": [], "partitions": {}}
    rows = rows.slice(max(0, rows.num_rows - CHART_BATCHES * TOP_PARTITIONS * 4))
    now = _latest_lags(snap, name)
    top = sorted(now, key=lambda part: (-now[part], part))[:TOP_PARTITIONS]
    times: list[int] = []
    values: dict[str, list[int | None]] = {part: [] for part in top}
    current: dict[str, int | None] = dict.fromkeys(top)
    for r in rows.select(["partition", "latest_loaded", "source_latest", "time_ms"]).to_pylist():
        if r["partition"] not in current or r["source_latest"] is None:
            continue
        current[r["partition"]] = max(0, r["source_latest"] - (r["latest_loaded"] or 0))
        if times and times[-1] == r["time_ms"]:
            for part in top:
                values[part][-1] = current[part]
            continue
        times.append(r["time_ms"])
        for part in top:
            values[part].append(current[part])
    keep = slice(-CHART_BATCHES, None)
    return {"t": [ms / 1000 for ms in times[keep]], "partitions": {part: v[keep] for part, v in values.items()}}


def timeline(snap: Snapshot, selected: Sequence[str] | None, lake_uri: str) -> dict[str, Any]:
    """Every upper on one axis, and the joint cut of ``selected`` (all pipelines by default)."""
    names = [n for n in (selected or snap.pipelines) if n in snap.pipelines]
    pipelines = [
        {
            "name": p.name,
            "state": state_of(p),
            "readable_upper": p.readable_upper,
            "finished": p.finished,
            "outputs": [{"name": o, "upper": s.upper} for o, s in p.outputs.items()],
        }
        for p in snap.pipelines.values()
    ]
    return {
        "taken_ms": snap.taken_ms,
        "pipelines": pipelines,
        "selected": names,
        "cut": _cut(snap, names, lake_uri) if names else None,
    }


def _cut(snap: Snapshot, names: list[str], lake_uri: str) -> dict[str, Any]:
    """:func:`~reclock.persist.asof.latest_cut` of ``names`` from the snapshot's uppers: the joint
    readable upper - 1, or, when all are finished, the newest of their bindings."""
    states = [snap.pipelines[n] for n in names]
    if any(p.readable_upper is None for p in states):
        unreadable = [p.name for p in states if p.readable_upper is None]
        return {"joint_upper": None, "as_of": None, "held_back_by": None, "error": f"cannot read {unreadable}"}
    held = min(states, key=lambda p: p.readable_upper or 0)
    joint = held.readable_upper or 0
    if joint == CLOSED_UPPER:
        as_of, holder = max(p.bindings_upper for p in states) - 1, None
    else:
        as_of = joint - 1
        outputs = {o: s.upper for o, s in held.outputs.items() if s.upper is not None}
        # The output furthest behind; among equals a data output rather than _errors.
        behind = min(outputs, key=lambda o: (outputs[o], o == "_errors", o)) if outputs else None
        holder = {"pipeline": held.name, "output": behind}
    return {
        "joint_upper": joint,
        "as_of": as_of,
        "held_back_by": holder,
        "recipes": _recipes(lake_uri, names, as_of, {p.name: list(p.outputs) for p in states}),
    }


def _recipes(lake: str, names: list[str], as_of: int, outputs: Mapping[str, list[str]]) -> dict[str, str]:
    """How to read the cut: reclock's own call, and polars, DuckDB and Spark over the same tables
    (append outputs: an upsert output's latest version is not its state at ``as_of``;
    ``read_as_of`` time-travels those)."""
    remote = "://" in lake
    options = ", storage_options=options" if remote else ""
    p0 = names[0]
    o0 = next((o for o in outputs[p0] if o != "_errors"), "_errors")
    table = f"{lake}/{p0}/outputs/{o0}"
    comment = "# options: how you reach the lake, as for reclock --storage-option\n" if remote else ""
    return {
        "read_as_of": (
            f"{comment}from reclock.persist.asof import read_as_of\n\n"
            f"cut = read_as_of({lake!r}, {json.dumps(names)}, {as_of}{options})\n"
            f"# {{pipeline: {{output: pyarrow.Table}}}}, e.g. cut[{p0!r}][{o0!r}]"
        ),
        "cli": f"reclock --lake {lake} as-of {' '.join(names)} --at {as_of}",
        "polars": (
            "import polars as pl\n\n"
            f"{p0}_{o0} = pl.scan_delta({table!r}{', storage_options=delta_options' if remote else ''})"
            f'.filter(pl.col("_into_ts") <= {as_of}).collect()'
        ),
        "duckdb": (
            "import duckdb  # with the delta extension (pip install duckdb-extension-delta)\n\n"
            f"duckdb.sql(\"SELECT * FROM delta_scan('{table}') WHERE _into_ts <= {as_of}\").show()"
        ),
        "spark": (
            f"{comment}from reclock.persist.asof import read_as_of_spark\n\n"
            f"frames = read_as_of_spark(spark, {lake!r}, {json.dumps(names)}, {as_of}{options})"
        ),
    }


def table(
    snap: Snapshot,
    name: str,
    kind: str,
    *,
    offset: int = 0,
    limit: int = 50,
    where: Mapping[str, str] | None = None,
    record_errors: pa.Table | None = None,
    files: list[FileStatus] | None = None,
) -> dict[str, Any]:
    """One page of a table, newest first: ``where`` keeps rows whose column contains the text
    (any case). Filtered and paged in Arrow: only the page's rows become JSON."""
    if kind == "files":
        data = pa.Table.from_pylist([asdict(f) for f in files or []], schema=_FILES)
    elif kind == "offsets":
        data = _offsets_rows(snap, name)
    else:
        data = _rows_of(snap, kind, name).drop_columns(["pipeline"])
        if kind == "errors" and record_errors is not None and record_errors.num_rows:
            shaped = pa.table(
                {
                    "kind": record_errors.column("kind"),
                    "code": pa.array(["record"] * record_errors.num_rows, pa.string()),
                    "message": record_errors.column("message"),
                    "batch_id": record_errors.column(INTO_TS),
                    "partition": record_errors.column(PARTITION),
                    "offset": record_errors.column(OFFSET),
                    "time_ms": record_errors.column(INTO_TS),
                }
            )
            data = pa.concat_tables([data, shaped.select(data.column_names)]).sort_by("time_ms")
    for column, text in (where or {}).items():
        if column in data.column_names and text:
            shown = pc.cast(data.column(column), pa.string())
            data = data.filter(pc.fill_null(pc.match_substring(shown, text, ignore_case=True), False))
    total = data.num_rows
    if kind != "files":  # the others are oldest first: a page from the end, reversed
        end = max(0, total - offset)
        rows = data.slice(max(0, end - limit), end - max(0, end - limit)).to_pylist()[::-1]
    else:
        rows = data.slice(offset, limit).to_pylist()
    return {"pipeline": name, "table": kind, "total": total, "offset": offset, "rows": rows}


_FILES = pa.schema(
    [
        ("path", pa.string()),
        ("generation", pa.int64()),
        ("size", pa.int64()),
        ("state", pa.string()),
        ("into_ts", pa.int64()),
        ("reason", pa.string()),
    ]
)


def _offsets_rows(snap: Snapshot, name: str) -> pa.Table:
    """Per partition, its newest ``offsets`` row, with the lag it implies, oldest first."""
    rows = _rows_of(snap, "offsets", name)
    columns = ["earliest", "latest", "latest_loaded", "source_latest", "time_ms"]
    newest = rows.group_by("partition", use_threads=False).aggregate([(c, "last") for c in columns])
    newest = newest.rename_columns(["partition", "earliest", "bound", "loaded", "source_latest", "time_ms"])
    lag = pc.max_element_wise(pc.subtract(newest.column("source_latest"), newest.column("loaded")), 0)
    # Descending: a page is read from the end and reversed (as for the tables oldest first).
    return newest.append_column("lag", lag).sort_by([("partition", "descending")])

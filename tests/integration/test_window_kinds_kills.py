"""Issue 25, acceptance 1 and 2: every window kind survives random SIGKILLs, from outside.

Real ``reclock start`` jobs over the generator (over Kafka: ``kafka/test_kafka_window_kills.py``)
are SIGKILLed at random moments and restarted (2 kills in the normal suite, 8 with ``--long``). Then
every window table, read from its ``_delta_log`` by the independent reader of ``tests/faults``,
must equal a recomputation with polars (spans exploded from each kind's formula, sessions cut by
their gaps) over the output read the same way, for every window its label says is closed: none
missing, none twice, values equal; ``having`` is applied by DuckDB, not the engine that runs it.
Each label must be the one the kind's rule derives from the output's final upper, so no closed
window is held back, and every commit's rows end at or below its own label.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest

from reclock.persist.lake import Lake
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, label_of, read_rows
from tests.integration.helpers import write_config
from tests.integration.test_windows import POLARS, assert_windows_equal, start_job, wait_for, window_commits
from tests.waiting import PATIENCE_S, run_until

AGGREGATES = {"n": "count(*)", "total": "sum(v)", "lo": "min(v)", "hi": "max(v)", "mean": "avg(v)"}
ORDERED = {"first_w": "first(w)", "last_w": "last(w)"}
LAST = ("_last_partition", "_last_offset")
ROLL = {"n": "sum(n)", "total": "sum(total)", "lo": "min(lo)", "hi": "max(hi)", "first_w": "first(first_w)"}


def windows(output: str, key: str, event: str, session_key: str) -> list[dict]:
    """One window of each kind over ``output``, grouped by ``key``, a tilt chain of three, an
    event-time window over ``event``; sessions by ``session_key``, whose values pause."""
    aggs = {**AGGREGATES, **ORDERED}
    return [
        {
            "name": "evt",
            "output": output,
            "size_ms": 500,
            "time_column": event,
            "allowed_lateness_ms": 100,
            "group_by": [key],
            "aggregates": aggs,
        },
        {
            "name": "hop",
            "kind": "hop",
            "output": output,
            "size_ms": 1200,
            "slide_ms": 400,
            "group_by": [key],
            "aggregates": aggs,
        },
        {
            "name": "cum",
            "kind": "cumulate",
            "output": output,
            "step_ms": 500,
            "max_size_ms": 2000,
            "group_by": [key],
            "aggregates": aggs,
        },
        {"name": "cnt", "kind": "count", "output": output, "size": 25, "group_by": [key], "aggregates": aggs},
        {
            "name": "ses",
            "kind": "session",
            "output": output,
            "gap_ms": 350,
            "group_by": [session_key],
            "aggregates": aggs,
        },
        {
            "name": "big",
            "output": output,
            "size_ms": 700,
            "group_by": [key],
            "aggregates": AGGREGATES,
            "having": "n > 20 AND mean > lo",
        },
        {"name": "s1", "output": output, "size_ms": 1000, "group_by": [key], "aggregates": aggs},
        {
            "name": "s3",
            "from": "s1",
            "size_ms": 3000,
            "group_by": [key],
            "aggregates": {**ROLL, "last_w": "last(last_w)"},
        },
        {
            "name": "s9",
            "from": "s3",
            "size_ms": 9000,
            "group_by": [key],
            "aggregates": {**ROLL, "last_w": "last(last_w)"},
        },
    ]


def with_windows(config: Path, defined: list[dict]) -> Path:
    text = config.read_text()
    for w in defined:
        text += "\n[[windows]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in w.items() if k != "aggregates")
        text += "[windows.aggregates]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in w["aggregates"].items())
    config.write_text(text)
    return config


def due(w: dict, upper: int) -> int:
    """The label + 1 a kind's table must reach for the input's ``upper`` (docs/windows.md)."""
    if w.get("kind") == "count":
        return upper
    if w.get("kind") == "hop":
        return (upper - w["size_ms"]) // w["slide_ms"] * w["slide_ms"] + w["size_ms"]
    step = {"cumulate": w.get("step_ms"), "session": w.get("gap_ms")}.get(w.get("kind"), w.get("size_ms"))
    return upper // step * step


def spans(rows: pl.DataFrame, w: dict, key: str) -> pl.DataFrame:
    """``rows`` with ``_window_start``/``_window_end`` of every window of ``w`` holding them."""
    ts = pl.col("_into_ts")
    kind = w.get("kind", "tumbling")
    if kind in ("tumbling", "from"):
        size = w["size_ms"]
        return rows.with_columns(
            (ts // size * size).alias("_window_start"), (ts // size * size + size).alias("_window_end")
        )
    if kind == "hop":
        size, slide = w["size_ms"], w["slide_ms"]
        k = pl.int_ranges((ts - size) // slide + 1, ts // slide + 1).alias("__k")
        out = rows.with_columns(k).explode("__k")
        return out.with_columns(
            (pl.col("__k") * slide).alias("_window_start"), (pl.col("__k") * slide + size).alias("_window_end")
        )
    if kind == "cumulate":
        step, most = w["step_ms"], w["max_size_ms"]
        base = ts // most * most
        out = rows.with_columns(
            base.alias("_window_start"), pl.int_ranges((ts - base) // step + 1, most // step + 1).alias("__j")
        )
        return out.explode("__j").with_columns((pl.col("_window_start") + pl.col("__j") * step).alias("_window_end"))
    gap = w["gap_ms"]
    out = rows.sort([key, "_into_ts"]).with_columns(
        ((ts.diff().over(key).fill_null(gap)) >= gap).cum_sum().over(key).alias("__sid")
    )
    bounds = out.group_by([key, "__sid"]).agg(ts.min().alias("_window_start"), (ts.max() + gap).alias("_window_end"))
    return out.join(bounds, on=[key, "__sid"])


def counted(rows: pl.DataFrame, w: dict, key: str, upper: int) -> pl.DataFrame:
    """Per group, every ``size`` rows in source order; complete windows whose last row is below ``upper``."""
    size = w["size"]
    ordered = rows.sort([key, "_into_ts", "_partition", "_offset"]).with_columns(
        (pl.int_range(pl.len()).over(key) // size).alias("__n")
    )
    bounds = ordered.group_by([key, "__n"]).agg(
        pl.len().alias("__rows"),
        pl.col("_into_ts").min().alias("_window_start"),
        (pl.col("_into_ts").max() + 1).alias("_window_end"),
        pl.col("_partition").last().alias("_last_partition"),
        pl.col("_offset").last().alias("_last_offset"),
    )
    done = bounds.filter((pl.col("__rows") == size) & (pl.col("_window_end") <= upper))
    return ordered.join(done, on=[key, "__n"]).sort(["_into_ts", "_partition", "_offset"])


def recompute(rows: pl.DataFrame, w: dict, key: str, upper: int) -> list[dict]:
    aggregates = []
    direct = {**AGGREGATES, **ORDERED} if "from" in w else w["aggregates"]
    for name, text in direct.items():
        function, column = text.rstrip(")").split("(")
        aggregates.append(POLARS[function](column).alias(name))
    if w.get("kind") == "count":
        exploded = counted(rows, w, key, upper)
    else:
        exploded = spans(
            rows.sort(["_into_ts", "_partition", "_offset"]), {**w, "kind": w.get("kind", "tumbling")}, key
        )
    frame = (
        exploded.filter(pl.col("_window_end") <= upper)
        .sort(["_into_ts", "_partition", "_offset"])
        .group_by(
            ["_window_start", "_window_end", key, *(LAST if w.get("kind") == "count" else ())], maintain_order=True
        )
        .agg(aggregates)
    )
    if "having" in w:  # by another engine than the one the pipeline ran it with
        frame = duckdb.sql(f"SELECT * FROM frame WHERE {w['having']}").pl()
    return [
        {k: v for k, v in r.items() if k in ("_window_start", key, *LAST, *w["aggregates"])} | {"_e": r["_window_end"]}
        for r in frame.to_dicts()
    ]


def check_kinds(lake: Path, pipeline: str, output: str, defined: list[dict]) -> int:
    output_log = DeltaLog(lake / pipeline / "outputs" / output).refresh()
    upper = label_of(output_log, f"reclock/{pipeline}/{output}") + 1
    rows = pl.from_arrow(read_rows(output_log))
    labels: dict[str, int] = {}
    for w in defined:
        key = w["group_by"][0]
        if "time_column" in w:
            check_events(lake, pipeline, rows, upper, w, key)
            continue
        table = lake / pipeline / "windows" / w["name"]
        app_id = f"reclock/{pipeline}/windows/{w['name']}"
        label = label_of(DeltaLog(table).refresh(), app_id) + 1
        source_upper = labels[w["from"]] if "from" in w else upper
        assert label == due(w, source_upper), f"{w['name']}: label {label}, the rule says {due(w, source_upper)}"
        labels[w["name"]] = label
        previous, got = 0, []
        for commit_label, added in window_commits(table, app_id):
            assert commit_label + 1 > previous and all(previous < r["_window_end"] <= commit_label + 1 for r in added)
            previous = commit_label + 1
            got += [
                {k: v for k, v in r.items() if k not in ("_into_ts", "_window_end")} | {"_e": r["_window_end"]}
                for r in added
            ]
        want = recompute(rows, w, key, label)
        assert len(want) > 3, f"{w['name']}: too few windows to mean anything"
        last = list(LAST) if w.get("kind") == "count" else []  # count windows: several may share their bounds
        assert_windows_equal(got, want, {"name": w["name"], "group_by": [key, "_e", *last]})
    return upper


def check_events(lake: Path, pipeline: str, rows: pl.DataFrame, upper: int, w: dict, key: str) -> None:
    """The event-time window and its late table against the definition, recomputed with polars:
    M before a row is the greatest event time of smaller into times; late when the row's window
    ends at or below M - lateness; a window closes one past the first into time at or above its
    end + lateness. Every row is in a closed window, or late, or in a window not yet closed."""
    size, lateness, ev = w["size_ms"], w["allowed_lateness_ms"], pl.col(w["time_column"])
    app_id = f"reclock/{pipeline}/windows/{w['name']}"
    table, late_table = lake / pipeline / "windows" / w["name"], lake / pipeline / "windows" / f"{w['name']}_late"
    assert label_of(DeltaLog(table).refresh(), app_id) + 1 == upper, "event windows move with every pass"
    assert label_of(DeltaLog(late_table).refresh(), f"{app_id}_late") + 1 == upper
    per_into = rows.group_by("_into_ts").agg(ev.max().alias("m")).sort("_into_ts")
    per_into = per_into.with_columns(pl.col("m").cum_max().shift(1).alias("before"))
    judged = rows.join(per_into.select("_into_ts", "before"), on="_into_ts").with_columns(
        (ev // size * size).alias("_window_start"), (ev // size * size + size).alias("_window_end")
    )
    late = judged.filter(ev.is_null() | (pl.col("_window_end") <= pl.col("before") - lateness))
    kept = judged.filter(ev.is_not_null() & ~(pl.col("_window_end") <= pl.col("before") - lateness).fill_null(False))
    ends = kept.select("_window_end").unique()
    closes = ends.join_where(
        rows.select("_into_ts", ev.alias("__ev")), pl.col("__ev") >= pl.col("_window_end") + lateness
    )
    closes = closes.group_by("_window_end").agg((pl.col("_into_ts").min() + 1).alias("closes"))
    on_time = kept.join(closes, on="_window_end").filter(pl.col("_into_ts") < pl.col("closes"))
    aggregates = []
    for name, text in w["aggregates"].items():
        function, column = text.rstrip(")").split("(")
        aggregates.append(POLARS[function](column).alias(name))
    want = (
        on_time.sort(["_into_ts", "_partition", "_offset"])
        .group_by(["_window_start", "_window_end", key], maintain_order=True)
        .agg(aggregates)
    )
    want_rows = [{k: v for k, v in r.items() if k != "_window_end"} | {"_e": r["_window_end"]} for r in want.to_dicts()]
    got = [
        {k: v for k, v in r.items() if k not in ("_into_ts", "_window_end")} | {"_e": r["_window_end"]}
        for _, added in window_commits(table, app_id)
        for r in added
    ]
    assert len(want_rows) > 3, "too few event windows to mean anything"
    assert_windows_equal(got, want_rows, {"name": w["name"], "group_by": [key, "_e"]})
    got_late = sorted(
        (r["_partition"], r["_offset"]) for _, added in window_commits(late_table, f"{app_id}_late") for r in added
    )
    assert got_late == sorted(zip(late["_partition"].to_list(), late["_offset"].to_list(), strict=True)), "late rows"
    waiting = kept.join(closes, on="_window_end", how="left").filter(
        pl.col("closes").is_null() | (pl.col("_into_ts") >= pl.col("closes"))
    )
    assert sum(r["n"] for r in got) + len(got_late) + waiting.height == rows.height, "a row counted twice or lost"


def restart_until_windows(lake: Path, name: str, output: str, defined: list[dict]) -> None:
    """The last start after the kills, run until its output's upper moved past where the kills
    left it and every window holds enough rows for :func:`check_kinds` to mean something, then
    stopped: the sources never end, and what a run of N seconds covers depends on the load."""

    def upper() -> int:
        return label_of(DeltaLog(lake / name / "outputs" / output).refresh(), f"reclock/{name}/{output}") or 0

    def emitted(window: str) -> int:
        table = read_rows(DeltaLog(lake / name / "windows" / window).refresh())
        return table.num_rows if table is not None else 0

    killed_at = upper()
    run_until(
        Lake.at(str(lake)),
        name,
        lambda: upper() > killed_at + 2 * 1200 and all(emitted(w["name"]) > 3 for w in defined),
        "every window emitted after the kills",
    )


def kill_and_restart(lake: Path, name: str, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    first = lake / name / "windows" / "s1"
    for _ in range(kills):
        job = start_job(lake, name)
        wait_for(lambda: len(window_commits(first, f"reclock/{name}/windows/s1")) >= 1, 120, "a window")
        time.sleep(rng.uniform(0.2, 2.0))
        os.killpg(job.pid, signal.SIGKILL)  # anywhere: mid-batch, mid-window, between two tables' commits
        job.wait(timeout=PATIENCE_S)


@pytest.mark.usefixtures("reclock_processes")
def test_every_window_kind_over_the_generator_equals_a_recomputation_after_random_sigkills(tmp_path, long_lane):
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "auctions", "lake": "lake", "engine": "local", "batch_interval": 0.1, "idle_interval": 0.5},
        source={"kind": "generator", "partitions": 3, "rate": 3000},
    )
    outputs = '[outputs.bids]\nsql = "SELECT channel, auction, price AS v, bidder AS w, date_time FROM input"\n'
    config.write_text(config.read_text() + outputs)
    defined = windows("bids", "channel", "date_time", "auction")
    assert reclock_in_process("create", str(with_windows(config, defined))).returncode == 0
    kill_and_restart(lake, "auctions", 8 if long_lane else 2, seed=25)
    restart_until_windows(lake, "auctions", "bids", defined)
    check_kinds(lake, "auctions", "bids", defined)

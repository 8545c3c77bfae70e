"""The long-running ingest job: a stored definition, run until stopped, observable from outside.

``create`` validates a definition and stores it in the lake; ``run`` builds the source, the data
plane and the pipeline from it and steps until the source finishes or a stop is asked for, by
SIGINT/SIGTERM or by ``reclock stop`` (a marker file, so it works from any process that sees the
lake). Either way the in-flight batch completes first. After every batch the job publishes a
status snapshot and, on a terminal, one progress line.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from persist.lake import Lake
from reclock.config import PipelineConfig, build_source, parse_config
from reclock.dataplane import DataPlane, LocalDataPlane, SparkDataPlane
from reclock.errors import ConfigError
from reclock.pipeline import BatchReport, Pipeline, wall_clock_ms
from reclock.status import Status, write_status

__all__ = ["create", "load", "request_stop", "run"]


def create(config: PipelineConfig, *, replace: bool = False, now: Callable[[], int] = wall_clock_ms) -> Path:
    """Validate ``config`` (the source too) and store it; refuse to silently change an existing one."""
    build_source(config, created_at_ms=now())
    lake = Lake.at(config.lake)
    path = lake.definition_path(config.name)
    definition = config.to_dict()
    if path.exists():
        stored = json.loads(path.read_text())
        if stored["definition"] == definition:
            return path
        if not replace:
            raise ConfigError(
                "pipeline.name",
                f"pipeline {config.name!r} already exists with another definition; use --replace to change it",
            )
        created = stored["created_at_ms"]
    else:
        created = now()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"definition": definition, "created_at_ms": created}, indent=1))
    return path


def load(lake: Lake, name: str) -> tuple[PipelineConfig, int]:
    path = lake.definition_path(name)
    if not path.exists():
        known = ", ".join(lake.pipelines()) or "none"
        raise ConfigError("name", f"no pipeline {name!r} in lake {lake.root} (known: {known})")
    stored = json.loads(path.read_text())
    return parse_config(stored["definition"], file=str(path)), stored["created_at_ms"]


def request_stop(lake: Lake, name: str) -> None:
    """Ask a running job to stop after its in-flight batch."""
    control = lake.control_dir(name)
    control.mkdir(parents=True, exist_ok=True)
    (control / "stop").touch()


def run(lake: Lake, name: str, *, progress: TextIO | None = None, max_seconds: float | None = None) -> Pipeline:
    """Run the stored pipeline ``name`` until it finishes, is stopped, or ``max_seconds`` pass."""
    config, created_at = load(lake, name)
    source = build_source(config, created_at_ms=created_at, file=str(lake.definition_path(name)))
    stop = threading.Event()
    stop_file = lake.control_dir(name) / "stop"
    stop_file.unlink(missing_ok=True)
    handlers = _on_signals(stop)
    watcher = threading.Thread(target=_watch, args=(stop_file, stop, max_seconds), daemon=True)
    watcher.start()
    pipeline = Pipeline(name, lake, source, data_plane=_data_plane(config), settings=config.settings)
    status = Status(pipeline=name, health=pipeline.health.value, pid=os.getpid())
    started = time.monotonic()

    def on_batch(report: BatchReport) -> None:
        status.batches += 0 if report.idle else 1
        for output, rows in report.rows.items():
            status.rows[output] = status.rows.get(output, 0) + rows
        _publish(lake, pipeline, status)
        if progress is not None:
            _progress_line(progress, pipeline, status, time.monotonic() - started)

    try:
        pipeline.run(stop, on_batch=on_batch)
    finally:
        stop.set()
        _publish(lake, pipeline, status)
        if progress is not None:
            progress.write("\n")
            progress.flush()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return pipeline


def _data_plane(config: PipelineConfig) -> DataPlane:
    if config.engine == "local":
        return LocalDataPlane()
    from reclock.spark import spark_session

    return SparkDataPlane(spark_session(config.spark_master, config.spark_conf))


def _on_signals(stop: threading.Event) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def _watch(stop_file: Path, stop: threading.Event, max_seconds: float | None) -> None:
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while not stop.wait(0.2):
        if stop_file.exists() or (deadline is not None and time.monotonic() > deadline):
            stop.set()


def _publish(lake: Lake, pipeline: Pipeline, status: Status) -> None:
    status.health = pipeline.health.value
    status.finished = pipeline.finished
    status.last_error = pipeline.last_error
    status.resume_upper = pipeline.resume_upper
    status.resume_frontier = pipeline.resume_frontier().to_json()
    status.bindings = len(pipeline.remap.bindings)
    status.updated_ms = wall_clock_ms()
    write_status(lake, status)


def _progress_line(out: TextIO, pipeline: Pipeline, status: Status, elapsed: float) -> None:
    rows = sum(status.rows.values())
    lag = pipeline.lag
    into = pipeline.resume_upper - 1
    stamp = time.strftime("%H:%M:%S", time.localtime(into / 1000)) if into > 0 else "-"
    line = (
        f"{pipeline.name}  {pipeline.health.value:<8} batches {status.batches:>5}  rows {rows:>12,}"
        f"  {rows / max(elapsed, 1e-9):>10,.0f} rows/s  lag {lag if lag is not None else '-':>10}  into {stamp}"
    )
    if out.isatty():
        out.write("\r" + line)
    else:
        out.write(line + "\n")
    out.flush()

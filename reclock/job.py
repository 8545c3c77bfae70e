"""The long-running ingest job: a stored definition, run until stopped, observable from outside.

``create`` validates a definition and stores it in the lake; ``run`` builds the source, the data
plane and the pipeline from it and steps until the source finishes or a stop is asked for, by
SIGINT/SIGTERM or by ``reclock stop`` (a marker file, so it works from any process that sees the
lake). Either way the in-flight batch completes first. After every batch the job publishes a
status snapshot and, on a terminal, one progress line.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any, TextIO

from reclock.config import PipelineConfig, build_source, expand_storage_options, parse_config, redacted
from reclock.dataplane import DataPlane, LocalDataPlane, StartingSparkDataPlane
from reclock.errors import ConfigError, ReclockError, StorageError
from reclock.file_states import FileStatus, drop_refusal, read_file_states
from reclock.health import Health
from reclock.maintenance import MaintenanceReport
from reclock.maintenance import maintain as run_maintenance
from reclock.metrics import Metrics
from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.remap import RemapTable
from reclock.persist.status_tables import StatusTables
from reclock.persist.store import LakePath, Store
from reclock.pipeline import BatchReport, BatchState, Pipeline
from reclock.resumption import resume_upper
from reclock.sources.base import Source
from reclock.sources.files import FilesSource
from reclock.status import HEARTBEAT_S, Status, write_status
from reclock.status_restore import restore_history
from reclock.time import Frontier, Partition, encode_partition, wall_clock_ms

__all__ = ["create", "drop_file", "file_states", "lake_of", "load", "request_stop", "run"]

log = logging.getLogger("reclock.job")


def create(
    config: PipelineConfig,
    *,
    replace: bool = False,
    now: Callable[[], int] = wall_clock_ms,
    file: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> LakePath:
    """Validate ``config`` (the source too) and store it; refuse to silently change an existing one.

    ``file`` is where the definition came from: the source's own errors name it like the others.
    The lake is reached with the config's ``[storage_options]`` and then ``storage_options`` (the
    command line's, which win); neither is stored in the definition (see :func:`lake_of`).
    """
    build_source(config, created_at_ms=now(), file=file)
    lake = lake_of(config, storage_options)
    path = lake.definition_path(config.name)
    definition = config.to_dict()
    if lake.store.exists(path):
        stored = json.loads(lake.store.read_text(path))
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
    lake.store.write_text(path, json.dumps({"definition": definition, "created_at_ms": created}, indent=1))
    return path


def lake_of(config: PipelineConfig, storage_options: Mapping[str, Any] | None = None) -> Lake:
    """The lake a definition names, reached with its ``[storage_options]`` (``${NAME}`` expanded
    from the environment) and then ``storage_options``, which win."""
    options = {**expand_storage_options(config.storage_options), **(storage_options or {})}
    return Lake.at(config.lake, options or None)


def load(lake: Lake, name: str) -> tuple[PipelineConfig, int]:
    path = lake.definition_path(name)
    if not lake.store.exists(path):
        known = ", ".join(lake.pipelines()) or "none"
        raise ConfigError("name", f"no pipeline {name!r} in lake {lake.root} (known: {known})")
    stored = json.loads(lake.store.read_text(path))
    return parse_config(stored["definition"], file=str(path)), stored["created_at_ms"]


def request_stop(lake: Lake, name: str) -> None:
    """Ask a running job to stop after its in-flight batch."""
    lake.store.touch(lake.control_dir(name) / "stop")


def file_states(lake: Lake, name: str) -> list[FileStatus]:
    """Every file a files pipeline has bound or lists now, with its state (none for other sources).

    Derived from the lake and the directory each time (see :mod:`reclock.file_states`), so it is
    right after any crash, whether or not a job is running.
    """
    config, created_at = load(lake, name)
    if config.source["kind"] != "files":
        return []
    return read_file_states(lake, name, _files_source(lake, name, config, created_at))


def drop_file(lake: Lake, name: str, path: str) -> int:
    """Forget a Loaded or Skipped file so the next batch ingests it again, as new data.

    The file becomes a new partition ``(path, generation + 1)``: its earlier rows stay where they
    are (they were correct when loaded), and the new generation starts at offset 0. Any other
    state is refused with a :class:`ConfigError` naming ``path`` (see
    :func:`reclock.file_states.drop_refusal`). The generations file is replaced atomically and
    synced, so a drop, once returned, survives a crash.
    """
    config, created_at = load(lake, name)
    if config.source["kind"] != "files":
        raise ConfigError(
            "source.kind", f"drop-file applies to files pipelines; {name!r} reads {config.source['kind']}"
        )
    source = _files_source(lake, name, config, created_at)
    generations = source.generations()
    why = drop_refusal(read_file_states(lake, name, source), path, generations.get(path, 0))
    if why is not None:
        raise ConfigError("path", f"pipeline {name!r} cannot drop {path!r}: it {why} (see reclock files)")
    generations[path] = generations.get(path, 0) + 1
    lake.store.write_text(generations_file(lake, name), json.dumps(generations, indent=1, sort_keys=True), durable=True)
    return generations[path]


def maintain(
    lake: Lake, name: str, *, optimize: bool = True, vacuum: bool = True, history_minutes: int | None = None
) -> MaintenanceReport:
    """``reclock optimize`` / ``reclock vacuum``: one maintenance pass on a pipeline that is not running.

    A running job maintains its own tables on its schedule, between its batches; a second process
    doing it beside the job could make the job's MERGE conflict and retry, so the job lock is
    taken here and a running pipeline is refused.
    """
    config, _ = load(lake, name)
    policy = config.maintenance
    if history_minutes is not None:
        policy = replace(policy, history_minutes=history_minutes)
    lock = _exclusive(lake, name)
    try:
        outputs = {output: lake.output_path(name, output) for output in lake.outputs(name)}
        upper = resume_upper(output_upper(path, sink_id(name, o), lake.store) for o, path in outputs.items())
        remap = RemapTable(lake.remap_path(name), lake.store)
        return run_maintenance(remap, outputs, upper, wall_clock_ms(), policy, optimize=optimize, vacuum=vacuum)
    finally:
        lock.close()


def _source(lake: Lake, name: str, config: PipelineConfig, created_at: int) -> Source:
    """The stored pipeline's source, built the same way for the job and for the CLI's questions.

    A files source reads dropped files' generations from the lake: by path from a local lake, and
    through the lake's store from an object-store lake.
    """
    where = generations_file(lake, name)
    if lake.store.remote:
        reader = functools.partial(_text_or_none, lake.store, where)
        return build_source(
            config, created_at_ms=created_at, file=str(lake.definition_path(name)), generations_reader=reader
        )
    return build_source(
        config, created_at_ms=created_at, file=str(lake.definition_path(name)), generations_path=str(where)
    )


def _text_or_none(store: Store, path: LakePath) -> str | None:
    try:
        return store.read_text(path)
    except FileNotFoundError:
        return None


def _files_source(lake: Lake, name: str, config: PipelineConfig, created_at: int) -> FilesSource:
    source = _source(lake, name, config, created_at)
    assert isinstance(source, FilesSource), f"a files pipeline built {source!r}"
    return source


def generations_file(lake: Lake, name: str) -> LakePath:
    return lake.control_dir(name) / "generations.json"


def run(lake: Lake, name: str, *, progress: TextIO | None = None, max_seconds: float | None = None) -> Pipeline:
    """Run the stored pipeline ``name`` until it finishes, is stopped, or ``max_seconds`` pass."""
    config, created_at = load(lake, name)
    lock = _exclusive(lake, name)
    # Say "starting" at once: a snapshot left by a killed run must not read as a stale live job
    # while the data plane starts (a Spark session takes seconds).
    _heartbeat(lake, Status(pipeline=name, health=Health.STARTING.value, pid=os.getpid()))
    source = _source(lake, name, config, created_at)
    stop = threading.Event()
    stop_file = lake.control_dir(name) / "stop"
    lake.store.delete(stop_file)
    handlers = _on_signals(stop)
    pipeline = Pipeline(
        name,
        lake,
        source,
        data_plane=_data_plane(config, source),
        settings=config.settings,
        maintenance=config.maintenance,
    )
    status = Status(pipeline=name, health=pipeline.health.value, pid=os.getpid())
    watcher = threading.Thread(
        target=_watch,
        args=(lambda: lake.store.exists(stop_file), stop, max_seconds, lambda: _heartbeat(lake, status)),
        daemon=True,
    )
    watcher.start()
    tables = StatusTables(lake, retention_days=config.status_retention_days)
    config_json = json.dumps(redacted(config.to_dict()), sort_keys=True)
    _record_state(tables, pipeline, config_json)
    restore_history(lake, tables, pipeline)
    started = time.monotonic()
    first_offsets: dict[str, int] = {}
    last_health = [pipeline.health]
    metrics = Metrics(pipeline)
    if config.metrics_port is not None:
        status.metrics_port = metrics.serve(config.metrics_port)

    names: dict[Partition, str] = {}  # encoded partitions, for the published resume frontier

    def on_batch(report: BatchReport) -> None:
        if report.state is BatchState.SUCCEEDED:
            status.batches += 1
        if report.maintenance is not None:
            status.last_maintenance = {"at_ms": wall_clock_ms(), **asdict(report.maintenance)}
        for output, rows in report.rows.items():
            status.rows[output] = status.rows.get(output, 0) + rows
        _record_batch(tables, pipeline, report, first_offsets)
        metrics.observe(report)
        _publish(lake, pipeline, status, names)
        if progress is not None and not (report.idle and pipeline.health is last_health[0]):
            _progress_line(progress, pipeline, status, time.monotonic() - started)  # not once per idle wait
        last_health[0] = pipeline.health

    try:
        pipeline.run(stop, on_batch=on_batch, on_health=lambda p: _publish(lake, p, status, names))
    except Exception:
        if pipeline.health is not Health.FAILED:
            raise
    finally:
        stop.set()
        _record_state(tables, pipeline, config_json)
        tables.close()
        metrics.close()
        _publish(lake, pipeline, status, names)
        lock.close()
        if progress is not None:
            progress.write("\n")
            progress.flush()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return pipeline


def _record_state(tables: StatusTables, pipeline: Pipeline, config_json: str) -> None:
    state = {Health.FAILED: "Error", Health.STOPPED: "Stopped"}.get(pipeline.health, "Running")
    tables.append(
        "pipelines",
        [
            {
                "pipeline": pipeline.name,
                "state": state,
                "health": pipeline.health.value,
                "finished": pipeline.finished,
                "config": config_json,
                "last_error": pipeline.last_error,
            }
        ],
    )


def _record_batch(tables: StatusTables, pipeline: Pipeline, report: BatchReport, first: dict[str, int]) -> None:
    """Rows for ``batches`` (one per split), ``errors`` (failed splits), ``files`` and ``offsets``.

    ``first`` remembers, per partition, the first offset this job loaded: the ``earliest`` column.
    """
    if report.idle:
        return
    rows = []
    for r in report.results:
        rows.append(
            {
                "pipeline": pipeline.name,
                "batch_id": report.binding_ts,
                "state": report.state.value if not r.error else BatchState.FAILED.value,
                "partition": r.partition,
                "rows": r.rows,
                "bytes": r.bytes_read,
                "earliest_offset": r.earliest,
                "latest_offset": r.latest,
                "start_ms": r.started_ms,
                "duration_ms": r.duration_ms,
                "error": r.error,
            }
        )
    if not report.results:
        rows.append(
            {
                "pipeline": pipeline.name,
                "batch_id": report.binding_ts,
                "state": BatchState.NO_DATA.value,
                "rows": 0,
                "bytes": 0,
                "start_ms": report.started_ms,
                "duration_ms": report.duration_ms,
            }
        )
    tables.append("batches", rows)
    failed = [r for r in report.results if r.error]
    tables.append(
        "errors",
        [
            {
                "pipeline": pipeline.name,
                "kind": f"batch {r.error_kind}",
                "code": (r.error or "").split(":", 1)[0],
                "message": r.error,
                "batch_id": report.binding_ts,
                "partition": r.partition,
                "offset": r.split.start,
            }
            for r in failed
        ],
    )
    files = []
    if report.state is BatchState.SUCCEEDED:
        files += [_file_row(pipeline, r.split.partition, r.split.end, "Loaded", report) for r in report.results]
        files += [_file_row(pipeline, s.partition, s.end, "Skipped", report) for s in report.skips]
        for r in report.results:
            if r.earliest is not None:
                first[r.partition] = min(first.get(r.partition, r.earliest), r.earliest)
        resume = pipeline.resume_frontier()
        tables.append(
            "offsets",
            [
                {
                    "pipeline": pipeline.name,
                    "partition": encode_partition(p),
                    "earliest": first.get(encode_partition(p)),
                    "latest": o,
                    "latest_loaded": o if resume.is_closed else resume.offset(p),
                }
                for p, o in report.upper.items()
                # A file's offsets never change once it is loaded: a files batch writes the files it
                # moved, not a row for every file ever loaded (``reclock files`` is the full view).
                if not pipeline.source.is_file_source or o != report.lower.offset(p)
            ],
        )
    tables.append("files", [row for row in files if row is not None])


def _file_row(pipeline: Pipeline, partition: object, size: int, state: str, report: BatchReport) -> dict | None:
    if not pipeline.source.is_file_source or not isinstance(partition, tuple):
        return None
    path, generation = partition
    return {
        "pipeline": pipeline.name,
        "path": path,
        "generation": generation,
        "size": size,
        "state": state,
        "batch_id": report.binding_ts,
    }


def _exclusive(lake: Lake, name: str) -> TextIO:
    """Hold the pipeline's job lock for this process's lifetime (the OS drops it if we die).

    Only one driver may run a pipeline; the sinks fence a second one anyway (on any machine), but
    refusing it up front on the same machine gives a clear message instead of a stalled job. The
    lock is held on a read-only descriptor (``flock`` does not need write access) and the holder's
    pid written through another, short-lived one, so a running job keeps no lake file open for
    writing between its writes: an operator can remount the lake read-only, and the job stalls.
    """
    path = lake.job_lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    handle = open(path)  # noqa: SIM115 - held open on purpose until the job ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ReclockError(f"pipeline {name!r} is already running ({holder}); stop it first") from None
    path.write_text(f"pid {os.getpid()}")
    return handle


def _data_plane(config: PipelineConfig, source: Source) -> DataPlane:
    """The configured plane; on a cluster, executors get reclock and the source's package shipped."""
    if config.engine == "local":
        return LocalDataPlane()
    from reclock.spark import shipped_packages, spark_session

    ship = shipped_packages(source)

    def start() -> Any:
        return spark_session(config.spark_master, config.spark_conf, ship=ship)

    plane = StartingSparkDataPlane(start, small_batch_offsets=config.small_batch_offsets)
    if not config.spark_background_start:
        plane.wait()
    return plane


def _on_signals(stop: threading.Event) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def _watch(
    stop_requested: Callable[[], bool], stop: threading.Event, max_seconds: float | None, beat: Callable[[], None]
) -> None:
    """Stop on request or deadline; keep the status snapshot fresh while a batch or backoff runs."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    next_beat = time.monotonic() + HEARTBEAT_S
    while not stop.wait(0.2):
        if _asked(stop_requested) or (deadline is not None and time.monotonic() > deadline):
            stop.set()
        if time.monotonic() >= next_beat:
            beat()
            next_beat = time.monotonic() + HEARTBEAT_S


def _asked(stop_requested: Callable[[], bool]) -> bool:
    """Whether a stop was requested; a lake that cannot be asked now (a network blip) has not."""
    try:
        return stop_requested()
    except OSError as exc:
        log.info("could not look for a stop request: %s", exc)
        return False


_status_lock = threading.Lock()


def _heartbeat(lake: Lake, status: Status) -> None:
    """Re-stamp the last snapshot as of now: the job is alive and can still write the lake."""
    with _status_lock:
        try:
            status.updated_ms = wall_clock_ms()
            write_status(lake, status)
        except OSError as exc:
            log.warning("pipeline %s: could not publish its status: %s", status.pipeline, exc)


def _publish(lake: Lake, pipeline: Pipeline, status: Status, names: dict[Partition, str]) -> None:
    """Write the status snapshot; a lake that refuses it must not end the job (see StorageError).

    ``names`` keeps each partition's encoded name for the job: a files frontier names every file
    ever loaded, and encoding them all again at every batch cost more than the batch's reads.

    The snapshot is observability: the next publish after the storage recovers repairs it, and
    readers never trust a stale ``running`` anyway (:func:`reclock.status.read_status`).
    """
    with _status_lock:
        try:
            status.health = pipeline.health.value
            status.finished = pipeline.finished
            status.last_error = pipeline.last_error
            if status.resume_upper != pipeline.resume_upper or status.resume_frontier == "{}":
                # R(resume_upper - 1) is fixed by resume_upper: encode it only when it moved (an
                # idle job publishes at every probe).
                status.resume_upper = pipeline.resume_upper
                status.resume_frontier = _frontier_json(pipeline.resume_frontier(), names)
            status.bindings = len(pipeline.remap.bindings)
            status.updated_ms = wall_clock_ms()
            write_status(lake, status)
        except (OSError, StorageError) as exc:
            log.warning("pipeline %s: could not publish its status: %s", pipeline.name, exc)


def _frontier_json(frontier: Frontier, names: dict[Partition, str]) -> str:
    """``frontier.to_json()``, encoding each partition once per job (see :func:`_publish`)."""
    if frontier.is_closed:
        return frontier.to_json()
    encoded = []
    for p, o in frontier.items():
        name = names.get(p)
        if name is None:
            name = names[p] = encode_partition(p)
        encoded.append((name, o))
    return json.dumps({"offsets": dict(sorted(encoded))}, separators=(",", ":"))


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

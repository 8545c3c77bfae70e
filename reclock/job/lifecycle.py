"""The long-running ingest job: a stored definition, run until stopped, observable from outside.

``create`` validates a definition and stores it in the lake; ``run`` builds the source, the data
plane and the pipeline from it and steps until the source finishes or a stop is asked for, by
SIGINT/SIGTERM or by ``reclock stop`` (a marker file, so it works from any process that sees the
lake). Either way the in-flight batch completes first. After every batch the job publishes a
status snapshot and, on a terminal, one progress line.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from reclock.errors import ConfigError, EngineUnavailable, ReclockError, describe
from reclock.job import status_publish
from reclock.job.config import PipelineConfig, build_source, check_shapes
from reclock.job.control import clear_stale_stop, exclusive, load, request_stop
from reclock.job.detach import attach
from reclock.job.file_states import FileStatus, drop_refusal, read_file_states
from reclock.job.leased_run import LeasedRun, on_signals
from reclock.job.progress import ProgressView
from reclock.job.secrets import expand_storage_options
from reclock.job.startup import data_plane, starting
from reclock.job.status import Status, StatusWriter
from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.lease import Lease
from reclock.persist.remap import RemapTable
from reclock.persist.store import LakePath, Store
from reclock.runtime import logs
from reclock.runtime.health import Health
from reclock.runtime.maintenance import MaintenanceReport, maintain_tables
from reclock.runtime.outputs import awaited_shapes, awaited_windows, check_layouts, outputs_of
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.shaping import route_outputs
from reclock.runtime.windows import check_windows
from reclock.sources.base import FileStates, Source, parse_generations
from reclock.timeline.frontier import IntoTime, wall_clock_ms
from reclock.timeline.resume import resume_upper

if TYPE_CHECKING:
    pass

__all__ = ["create", "drop_file", "file_states", "lake_of", "load", "maintain_pipeline", "request_stop", "run"]

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
    source = build_source(config, created_at_ms=now(), file=file)
    check_shapes(config, source, file=file)
    try:  # against the outputs as the pipeline writes them: shaped, routed, and with _errors
        declared = outputs_of(source)
        shaped, later = awaited_shapes(source, declared, config.shapes)
        outputs, _ = route_outputs(declared, shaped)
        # A window over an output that may join is checked when it is born (its columns then).
        check_windows(awaited_windows(source, outputs, config.windows, later)[0], list(outputs.values()))
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.reason, file=file) from None
    check_layouts(source, config.layouts, config.shapes, file=file)
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
        if any(stored["definition"].get(k) != definition.get(k) for k in _SHAPING):
            _refuse_inside_a_batch(lake, config.name)
        created = stored["created_at_ms"]
    else:
        created = now()
    lake.store.write_text(path, json.dumps({"definition": definition, "created_at_ms": created}, indent=1))
    return path


#: The sections of a definition that decide what a record becomes in its outputs.
_SHAPING = ("source", "outputs")


def _refuse_inside_a_batch(lake: Lake, name: str) -> None:
    """Refuse to change how records are decoded or shaped while a batch is half committed.

    Its replay would evaluate the batch's records with the new definition for the outputs that
    still lack it, beside what the old one wrote to the others: a record the old definition
    rejected in an output that holds the batch, but the new one accepts, would be in neither that
    output nor ``_errors``.
    """
    uppers = {o: output_upper(lake.output_path(name, o), sink_id(name, o), lake.store) for o in lake.outputs(name)}
    if len(set(uppers.values())) > 1:
        ahead = max(uppers, key=lambda o: uppers[o])
        behind = min(uppers, key=lambda o: uppers[o])
        raise ReclockError(
            f"pipeline {name!r} stopped inside batch {uppers[ahead] - 1} (output {ahead!r} holds it, {behind!r} does "
            "not): start it to finish that batch with the definition it began with, stop it, then replace"
        )


def lake_of(config: PipelineConfig, storage_options: Mapping[str, Any] | None = None) -> Lake:
    """The lake a definition names, reached with its ``[storage_options]`` (``${NAME}`` expanded
    from the environment) and then ``storage_options``, which win."""
    options = {**expand_storage_options(config.storage_options), **(storage_options or {})}
    return Lake.at(config.lake, options or None)


def file_states(lake: Lake, name: str) -> list[FileStatus]:
    """Every file a pipeline has bound or lists now, with its state (none unless its source has
    :class:`~reclock.sources.base.FileStates`).

    Derived from the lake and the directory each time (see :mod:`reclock.job.file_states`), so it is
    right after any crash, whether or not a job is running.
    """
    config, created_at = load(lake, name)
    source = source_of(lake, name, config, created_at)
    try:
        return read_file_states(lake, name, source) if isinstance(source, FileStates) else []
    finally:
        source.close()


def drop_file(lake: Lake, name: str, path: str) -> int:
    """Forget a Loaded or Skipped file so the next batch ingests it again, as new data.

    The file becomes a new partition ``(path, generation + 1)``: its earlier rows stay where they
    are (they were correct when loaded), and the new generation starts at offset 0. Any other
    state is refused with a :class:`ConfigError` naming ``path`` (see
    :func:`reclock.job.file_states.drop_refusal`). The generations file is replaced atomically and
    synced, so a drop, once returned, survives a crash. Only a source with
    :class:`~reclock.sources.base.FileStates` has files to drop; it reads their generations back
    through its :class:`~reclock.sources.base.SourceContext`.
    """
    config, created_at = load(lake, name)
    source = source_of(lake, name, config, created_at)
    try:
        if not isinstance(source, FileStates):
            raise ConfigError(
                "source.kind",
                f"drop-file applies to files pipelines (a source that keeps file states); "
                f"{name!r} reads {config.source['kind']}",
            )
        states = read_file_states(lake, name, source)
    finally:
        source.close()
    where = generations_file(lake, name)
    generations = parse_generations(_text_or_none(lake.store, where), str(where))
    why = drop_refusal(states, path, generations.get(path, 0))
    if why is not None:
        raise ConfigError("path", f"pipeline {name!r} cannot drop {path!r}: it {why} (see reclock files)")
    generations[path] = generations.get(path, 0) + 1
    lake.store.write_text(generations_file(lake, name), json.dumps(generations, indent=1, sort_keys=True), durable=True)
    return generations[path]


def maintain_pipeline(
    lake: Lake,
    name: str,
    *,
    optimize: bool = True,
    vacuum: bool = True,
    history_minutes: int | None = None,
    on_table: Callable[[str, int, int], None] | None = None,
) -> MaintenanceReport:
    """``reclock optimize`` / ``reclock vacuum``: one maintenance pass on a pipeline that is not running.

    A running job maintains its own tables on its schedule, between its batches; a second process
    doing it beside the job could make the job's MERGE conflict and retry, so the job's lease is
    taken here (:mod:`reclock.persist.lease`) and a running pipeline is refused.
    """
    config, _ = load(lake, name)
    policy = config.maintenance
    if history_minutes is not None:
        policy = replace(policy, history_minutes=history_minutes)
    lease = exclusive(lake, name, config.lease_ttl_s)
    try:
        outputs = {output: lake.output_path(name, output) for output in lake.outputs(name)}
        upper = resume_upper(output_upper(path, sink_id(name, o), lake.store) for o, path in outputs.items())
        remap = RemapTable(lake.remap_path(name), lake.store)
        return maintain_tables(
            remap,
            outputs,
            upper,
            wall_clock_ms(),
            policy,
            optimize=optimize,
            vacuum=vacuum,
            fence=lease.check,
            on_table=on_table,
        )
    finally:
        lease.release()


def source_of(lake: Lake, name: str, config: PipelineConfig, created_at: int) -> Source:
    """The stored pipeline's source, built the same way for the job and for the CLI's questions.

    A source with file states reads dropped files' generations from the lake, through the lake's
    store (and knows the file's path when the lake is local, to keep it out of its listing); a
    source with state of its own keeps it in the pipeline's folder, local or in object storage.
    """
    where = generations_file(lake, name)
    return build_source(
        config,
        created_at_ms=created_at,
        file=str(lake.definition_path(name)),
        generations_reader=functools.partial(_text_or_none, lake.store, where),
        generations_path=None if lake.store.remote else str(where),
        state_path=str(lake.control_dir(name) / "source"),
        state_options=lake.store.options,
    )


def _text_or_none(store: Store, path: LakePath) -> str | None:
    try:
        return store.read_text(path)
    except FileNotFoundError:
        return None


def generations_file(lake: Lake, name: str) -> LakePath:
    return lake.control_dir(name) / "generations.json"


def run(
    lake: Lake,
    name: str,
    *,
    progress: TextIO | ProgressView | None = None,
    max_seconds: float | None = None,
    metrics_host: str | None = None,
    until: IntoTime | None = None,
) -> Pipeline:
    """Run the stored pipeline ``name`` until it finishes, is stopped, or ``max_seconds`` pass.

    ``progress`` is shown a snapshot per batch (:mod:`reclock.job.progress`): a text stream gets
    the progress line, a view draws it its own way (the command line's bar on a terminal).
    ``metrics_host`` overrides the definition's ``metrics_host`` for this run. With ``until``
    the run also stops once every output holds that binding (``reclock redrive`` lands its
    request so). Every line the job logs on this thread names the pipeline (:mod:`reclock.runtime.logs`).
    """
    with logs.pipeline_scope(name):
        pipeline = _run(lake, name, progress, max_seconds, metrics_host, until)
        log.info("job ended: %s, %s", pipeline.health.value, "finished" if pipeline.finished else "not finished")
        return pipeline


def _run(
    lake: Lake,
    name: str,
    progress: TextIO | ProgressView | None,
    max_seconds: float | None,
    metrics_host: str | None,
    until: IntoTime | None,
) -> Pipeline:
    config, created_at = load(lake, name)
    if metrics_host is not None:
        config = replace(config, metrics_host=metrics_host)
    lease = exclusive(lake, name, config.lease_ttl_s)
    try:
        attach(lake, name)
        return _run_leased(lake, name, config, created_at, lease, progress, max_seconds, until)
    finally:
        lease.release()


def _run_leased(
    lake: Lake,
    name: str,
    config: PipelineConfig,
    created_at: int,
    lease: Lease,
    progress: TextIO | ProgressView | None,
    max_seconds: float | None,
    until: IntoTime | None = None,
) -> Pipeline:
    """The job under the pipeline's lease: it checks it before every durable write, so a job that
    lost it stops before its next commit, as failed, and writes no status over its successor's
    (:class:`~reclock.job.status.StatusWriter`, and the status tables' own fence).

    The steps, in order: say "starting", build the source and the data plane, open the pipeline,
    watch it (heartbeat, stop requests, a stalled source), open the status tables, serve
    ``/metrics``, run, and publish the final state."""
    stop = threading.Event()
    writer = starting(stop, config.settings, "reading its status", lambda: StatusWriter(lake, name, lease))
    # Say "starting" at once: a snapshot left by a killed run must not read as a stale live job
    # while the data plane starts (a Spark session takes seconds). It also fences a driver that
    # lost the lease to this one: its next conditional write of the snapshot fails.
    status_publish.heartbeat(writer, Status(pipeline=name, health=Health.STARTING.value, pid=os.getpid()))
    with status_publish.failed_start(writer, name):
        source = source_of(lake, name, config, created_at)
    try:
        plane = data_plane(config, source)
    except EngineUnavailable as exc:  # said by the command, once; the status keeps it for `reclock status`
        source.close()
        failed = Status(pipeline=name, health=Health.FAILED.value, last_error=describe(exc), pid=os.getpid())
        status_publish.say(writer, failed)
        raise
    token = lease.record.holder.token
    starting(stop, config.settings, "clearing a stop request", lambda: clear_stale_stop(lake, name, token))
    job = LeasedRun(lake, name, config, lease, writer, stop, on_signals(stop))
    job.open_pipeline(source, plane, progress)
    job.watch(token, max_seconds)
    job.open_tables()
    job.serve_metrics(source)
    log.info("job started: engine %s, lake %s, resume upper %d", config.engine, lake.root, job.pipeline.resume_upper)
    return job.run(until)

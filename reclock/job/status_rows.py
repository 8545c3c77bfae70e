"""The rows a running job appends to the status tables (:mod:`reclock.persist.status_tables`).

Observability, not exactly-once: a row lost to a SIGKILL is derived again at the next start
(:mod:`reclock.job.status_restore`); what is here only says which row each event becomes.
"""

from __future__ import annotations

from reclock.persist.status_tables import StatusTables
from reclock.runtime.health import Health
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.redrives import RedriveSplit
from reclock.runtime.reports import BatchReport, BatchState
from reclock.sources.base import FileStates
from reclock.timeline.frontier import encode_partition

__all__ = ["in_progress", "record_batch", "record_state"]


def record_state(tables: StatusTables, pipeline: Pipeline, config_json: str) -> None:
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


def record_batch(tables: StatusTables, pipeline: Pipeline, report: BatchReport, first: dict[str, int]) -> None:
    """Rows for ``batches`` (one per split), ``errors`` (failed splits), ``files`` and ``offsets``.

    ``first`` remembers, per partition, the first offset this job loaded: the ``earliest`` column.
    """
    if report.idle:
        return
    tables.append("batches", _batch_rows(pipeline, report))
    tables.append("errors", _error_rows(pipeline, report))
    files = []
    if report.state is BatchState.SUCCEEDED:
        files_source = isinstance(pipeline.source, FileStates)
        if files_source:
            loaded = [r for r in report.results if not isinstance(r.split, RedriveSplit)]  # a redrive loads no file
            files += [_file_row(pipeline, r.split.partition, r.split.end, "Loaded", report) for r in loaded]
            files += [_file_row(pipeline, s.partition, s.end, "Skipped", report) for s in report.skips]
        for r in report.results:
            if r.earliest is not None:
                first[r.partition] = min(first.get(r.partition, r.earliest), r.earliest)
        tables.append("offsets", _offset_rows(pipeline, report, first, files_source))
    tables.append("files", [row for row in files if row is not None])


def _batch_rows(pipeline: Pipeline, report: BatchReport) -> list[dict]:
    """The ``batches`` rows of a batch that ended: one per split, or one saying it had no data."""
    phases = {f"{phase}_ms": ms for phase, ms in report.phases.items()}
    if report.maintenance is not None:
        phases["maintenance_ms"] = report.maintenance.duration_ms
    rows = []
    for r in report.results:
        rows.append(
            {
                "pipeline": pipeline.name,
                "batch_id": report.binding_ts,
                "state": report.state.value if not r.error else BatchState.FAILED.value,
                "partition": r.partition,
                "rows": r.rows,
                "filtered": r.filtered,
                "bytes": r.bytes_read,
                "earliest_offset": r.earliest,
                "latest_offset": r.latest,
                "start_ms": r.started_ms,
                "duration_ms": r.duration_ms,
                "error": r.error,
                **phases,
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
                **phases,
            }
        )
    return rows


def _error_rows(pipeline: Pipeline, report: BatchReport) -> list[dict]:
    """The ``errors`` rows of a batch: one per split that failed."""
    return [
        {
            "pipeline": pipeline.name,
            "kind": f"batch {r.error_kind}",
            "code": (r.error or "").split(":", 1)[0],
            "message": r.error,
            "batch_id": report.binding_ts,
            "partition": r.partition,
            "offset": r.split.start,
        }
        for r in report.results
        if r.error
    ]


def _offset_rows(pipeline: Pipeline, report: BatchReport, first: dict[str, int], files_source: bool) -> list[dict]:
    """The ``offsets`` rows of a batch that succeeded: per partition it moved, how far it is loaded."""
    resume = pipeline.resume_frontier()
    probe = pipeline.minter.last_probe  # how far the source was: lag over time is probe - loaded
    return [
        {
            "pipeline": pipeline.name,
            "partition": encode_partition(p),
            "earliest": first.get(encode_partition(p)),
            "latest": o,
            "latest_loaded": o if resume.is_closed else resume.offset(p),
            "source_latest": None if probe is None or probe.is_closed else probe.offset(p),
        }
        for p, o in report.upper.items()
        # A file's offsets never change once it is loaded: a files batch writes the files it
        # moved, not a row for every file ever loaded (``reclock files`` is the full view).
        if not files_source or o != report.lower.offset(p)
    ]


def in_progress(pipeline: Pipeline, report: BatchReport) -> dict:
    """The ``batches`` row of a planned batch; ``reclock batches`` hides it once the batch ends."""
    return {
        "pipeline": pipeline.name,
        "batch_id": report.binding_ts,
        "state": BatchState.IN_PROGRESS.value,
        "start_ms": report.started_ms,
        **{f"{phase}_ms": ms for phase, ms in report.phases.items()},
    }


def _file_row(pipeline: Pipeline, partition: object, size: int, state: str, report: BatchReport) -> dict | None:
    """The ``files`` row of a partition of a :class:`FileStates` source, ``(path, generation)``."""
    if not isinstance(partition, tuple):
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

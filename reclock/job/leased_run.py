"""The job under its lease, once the source and the data plane are built: open the pipeline, watch
it, open the status tables, serve ``/metrics``, run, publish the final state.

Each step is a method of :class:`LeasedRun`, called in that order by the job
(:func:`~reclock.job.lifecycle.run`); the callbacks the pipeline and the watcher call are its
methods too, so what they share (the status being published, the status tables, the progress
tracker, ``/metrics``) is named state, each step testable alone, not captured by closures.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict, replace
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias

from reclock.errors import ConfigError
from reclock.job import status_publish, status_rows
from reclock.job.config import PipelineConfig
from reclock.job.control import stop_asked
from reclock.job.progress import PlainLines, ProgressView, Tracker
from reclock.job.secrets import redacted
from reclock.job.startup import starting
from reclock.job.status import Status, StatusWriter
from reclock.job.status_restore import restore_history
from reclock.job.watch import watch
from reclock.persist.lake import Lake
from reclock.persist.lease import Lease
from reclock.persist.status_tables import StatusTables
from reclock.runtime import logs
from reclock.runtime.health import Health
from reclock.runtime.pipeline import BatchReport, BatchState, Pipeline
from reclock.runtime.planes import DataPlane
from reclock.sources.base import Source
from reclock.timeline.frontier import IntoTime, Partition, wall_clock_ms

if TYPE_CHECKING:
    from reclock.job.metrics import Metrics

__all__ = ["LeasedRun", "on_signals"]

log = logging.getLogger("reclock.job")

#: What ``signal.signal`` returns and takes back: a handler, ``SIG_DFL``/``SIG_IGN``, or ``None``.
_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | None

#: Seconds between two looks for a stop request in a lake in object storage, at least: the batch
#: cadence (``batch_interval``) when it is slower. A look is a request to the store, billed; in a
#: local lake it is a ``stat``, so the job looks at every turn of its watcher and stops at once.
_STOP_POLL_S = 1.0


class LeasedRun:
    """One run of a pipeline under its lease, taken in steps (:meth:`open_pipeline`, :meth:`watch`,
    :meth:`open_tables`, :meth:`serve_metrics`, :meth:`run`): what those steps share, and the
    callbacks the pipeline and the watcher call (:meth:`on_step`, :meth:`beat`, :meth:`slow`,
    :meth:`on_batch`, :meth:`publish`)."""

    pipeline: Pipeline
    status: Status
    tables: StatusTables
    config_json: str

    def __init__(
        self,
        lake: Lake,
        name: str,
        config: PipelineConfig,
        lease: Lease,
        writer: StatusWriter,
        stop: threading.Event,
        handlers: dict[signal.Signals, _Handler],
    ) -> None:
        self.lake, self.name, self.config, self.lease, self.writer = lake, name, config, lease, writer
        self.stop, self.handlers = stop, handlers
        self.tracker: Tracker | None = None  # the progress tracker, once there is a pipeline to track
        self.metrics: Metrics | None = None
        self.first_offsets: dict[str, int] = {}
        self.names: dict[Partition, str] = {}  # encoded partitions, for the published resume frontier

    def open_pipeline(self, source: Source, plane: DataPlane, progress: TextIO | ProgressView | None) -> None:
        """Open the pipeline's tables and state (retried while the lake is unreachable)."""
        config = self.config
        with status_publish.failed_start(self.writer, self.name):  # a table that contradicts the definition
            self.pipeline = starting(
                self.stop,
                config.settings,
                "opening its tables",
                lambda: Pipeline(
                    self.name,
                    self.lake,
                    source,
                    data_plane=plane,
                    settings=config.settings,
                    maintenance=config.maintenance,
                    windows=config.windows,
                    layouts=config.layouts,
                    fence=self.lease.check,
                    shapes=config.shapes,
                    on_step=self.on_step,
                ),
            )
        self.status = Status(pipeline=self.name, health=self.pipeline.health.value, pid=os.getpid())
        if progress is not None:
            self.tracker = Tracker(_view(progress), self.pipeline, self.status)

    def on_step(self, step: str) -> None:
        if step == "minted" and self.tracker is not None:  # a fresh probe: a progress snapshot's lag is current
            self.tracker.probed()

    def watch(self, token: str, max_seconds: float | None) -> None:
        """Start the watcher: heartbeats, stop requests, ``max_seconds``, a source that stalls."""
        asked = functools.partial(stop_asked, self.lake, self.name, token)
        poll_s = max(self.config.settings.batch_interval, _STOP_POLL_S) if self.lake.store.remote else 0.0
        probing = self.pipeline.minter.probing_for
        args = (asked, self.stop, max_seconds, self.beat, probing, self.slow, poll_s)
        threading.Thread(target=watch, args=args, daemon=True).start()

    def beat(self) -> None:
        if not self.lease.lost:  # a driver that lost the pipeline no longer speaks for it
            status_publish.heartbeat(self.writer, self.status)

    def slow(self, waited: float) -> None:  # the loop waits in the probe: the snapshot is the watcher's to say
        error = (
            f"the {self.config.source['kind']} source has not answered for {waited:.0f} s (down, or unreachable?); "
            "the job waits for it and goes on when it answers"
        )
        log.warning("pipeline %s: stalled: %s", self.name, error)
        if not self.lease.lost:
            status_publish.say(self.writer, self.status, health=Health.STALLED.value, last_error=error)

    def open_tables(self) -> None:
        """The status tables: the pipeline's state now, and the history a killed run did not write."""
        self.tables = StatusTables(self.lake, retention_days=self.config.status_retention_days, fence=self.lease.check)
        self.config_json = json.dumps(redacted(self.config.to_dict()), sort_keys=True)
        status_rows.record_state(self.tables, self.pipeline, self.config_json)
        restore_history(self.lake, self.tables, self.pipeline)

    def serve_metrics(self, source: Source) -> None:
        """Serve ``/metrics`` if the pipeline asks for it; a port it cannot bind fails the job, named."""
        config = self.config
        if config.metrics_port is None:  # prometheus_client costs a second of start-up: only when served
            return
        from reclock.job.metrics import Metrics

        self.metrics = Metrics(self.pipeline)
        try:
            self.status.metrics_port = self.metrics.serve(config.metrics_port, config.metrics_host)
        except OSError as exc:  # a port in use, an address this machine does not have
            source.close()
            refusal = ConfigError(
                "pipeline.metrics_port",
                f"cannot serve /metrics on {config.metrics_host}:{config.metrics_port}: {exc.strerror or exc}; "
                "choose another metrics_port (0 picks a free one) or metrics_host (reclock start --metrics-host)",
            )
            self.stop.set()  # the watcher too
            self._restore_signals()
            status_publish.say(self.writer, replace(self.status, health=Health.FAILED.value, last_error=str(refusal)))
            raise refusal from None

    def publish(self, p: Pipeline, *, if_changed: bool = False) -> None:
        if not self.lease.lost:  # the pipeline's snapshot is its new driver's to write now
            status_publish.publish(self.writer, p, self.status, self.names, if_changed=if_changed)

    def on_batch(self, report: BatchReport, until: IntoTime | None) -> None:
        status, pipeline = self.status, self.pipeline
        if report.state is BatchState.SUCCEEDED:
            status.batches += 1
        if report.maintenance is not None:
            status.last_maintenance = {"at_ms": wall_clock_ms(), **asdict(report.maintenance)}
        for output, rows in report.rows.items():
            status.rows[output] = status.rows.get(output, 0) + rows
        status_rows.record_batch(self.tables, pipeline, report, self.first_offsets)
        if self.metrics is not None:
            self.metrics.observe(report)
        _log_batch(report)
        self.publish(pipeline, if_changed=report.idle)  # an idle step changes nothing the heartbeat does not
        if self.tracker is not None:
            self.tracker.batch(report)
        if until is not None and pipeline.resume_upper > until:
            self.stop.set()

    def run(self, until: IntoTime | None) -> Pipeline:
        """Step until stopped (or past ``until``), then publish the final state and close everything."""
        pipeline, tables = self.pipeline, self.tables
        if until is not None and pipeline.resume_upper > until:
            self.stop.set()
        try:
            pipeline.run(
                self.stop,
                on_batch=lambda report: self.on_batch(report, until),
                on_health=lambda p: self.publish(p, if_changed=True),  # heard after every batch too: once is enough
                on_start=lambda report: tables.append("batches", [status_rows.in_progress(pipeline, report)]),
            )
        except Exception:
            if pipeline.health is not Health.FAILED:
                raise
        finally:
            self.stop.set()
            if self.tracker is not None:  # its last snapshot, while /metrics still answers
                self.tracker.close()
            if not self.lease.lost:  # the pipeline's state is its new driver's to say now
                status_rows.record_state(tables, pipeline, self.config_json)
            tables.close()
            if self.metrics is not None:
                self.metrics.close()
            self.publish(pipeline)
            self._restore_signals()
        return pipeline

    def _restore_signals(self) -> None:
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)


def _view(progress: TextIO | ProgressView) -> ProgressView:
    """A text stream gets the plain progress line; anything else is a view that draws its own."""
    return progress if isinstance(progress, ProgressView) else PlainLines(progress)


def _log_batch(report: BatchReport) -> None:
    """INFO for a batch that committed, DEBUG for an idle step; failures are logged where they happen."""
    if report.idle:
        log.debug("idle: no new data")
    elif report.state is BatchState.SUCCEEDED:
        rows = ", ".join(f"{output} {n}" for output, n in sorted(report.rows.items()))
        with logs.batch_scope(report.binding_ts):
            log.info("committed in %d ms, rows: %s", report.duration_ms, rows or "none")


def on_signals(stop: threading.Event) -> dict[signal.Signals, _Handler]:
    """SIGINT and SIGTERM set ``stop`` (the in-flight batch completes first); the handlers they
    replaced, for :class:`LeasedRun` to put back. Off the main thread signals are not ours: none."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[signal.Signals, _Handler] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous

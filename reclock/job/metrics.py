"""Prometheus metrics of a running job, through ``prometheus_client``, on ``/metrics``.

A long-running ingest job should plug into the monitoring its users already have. Each job has
its own :class:`~prometheus_client.CollectorRegistry` (never the library's global one), so
several pipelines in one process, and tests, never see each other's series.

What is measured (every series has a ``pipeline`` label; the list is in ``docs/operations.md``):

* counters fed after each batch: rows per output, bytes read, batches by final state;
* histograms: batch duration, and *visible latency*: from a batch's into time (its binding's
  wall-clock time, minted just after the probe saw the batch's newest records) to the moment
  every output's commit of it is visible. For the newest records of a batch that is their
  produce-to-visible latency, less the time from their production to the probe; a catch-up
  batch after downtime shows the whole wait;
* gauges read from the pipeline at scrape time: lag (total and, for sources whose partitions are
  few, per partition: the source's upper at the last probe, for Kafka the high watermark, less
  the offset every output holds), each output's upper, the readable upper, resume upper, health;
* the process (CPU, memory, open files) and the interpreter (GC), from the default collectors.

The endpoint binds to 127.0.0.1 unless ``metrics_host`` (or ``reclock start --metrics-host``)
says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reclock.persist.asof import CLOSED_UPPER
from reclock.runtime.health import Health
from reclock.runtime.pipeline import BatchReport, BatchState, Pipeline
from reclock.sources.base import FileStates
from reclock.timeline.frontier import encode_partition, wall_clock_ms
from reclock.timeline.lag import partition_lags

__all__ = ["Metrics"]

_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)


class Metrics:
    """One job's metrics: fed by the job after every batch (:meth:`observe`), served on demand."""

    def __init__(self, pipeline: Pipeline, *, now: Callable[[], int] = wall_clock_ms) -> None:
        self.pipeline = pipeline
        self.registry = CollectorRegistry(auto_describe=True)
        self._now = now
        name = pipeline.name
        self._rows = Counter(
            "reclock_rows", "Rows committed to each output.", ["pipeline", "output"], registry=self.registry
        )
        self._bytes = Counter(
            "reclock_bytes", "Bytes of Arrow data read from the source.", ["pipeline"], registry=self.registry
        ).labels(name)
        self._batches = Counter(
            "reclock_batches", "Batches by final state.", ["pipeline", "state"], registry=self.registry
        )
        self._duration = Histogram(
            "reclock_batch_duration_seconds",
            "Time from a batch's plan to its last commit, for succeeded batches.",
            ["pipeline"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        ).labels(name)
        self._latency = Histogram(
            "reclock_visible_latency_seconds",
            "Time from a batch's into time (its binding, minted at the probe) until every output's commit "
            "of it is visible.",
            ["pipeline"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(name)
        self.registry.register(_PipelineGauges(pipeline))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._server: WSGIServer | None = None

    def observe(self, report: BatchReport) -> None:
        """Called by the job after each step, once the batch's commits are visible."""
        if report.idle:
            return
        name = self.pipeline.name
        self._batches.labels(name, report.state.value).inc()
        if report.state is not BatchState.SUCCEEDED:
            return
        for output, rows in report.rows.items():
            self._rows.labels(name, output).inc(rows)
        self._bytes.inc(sum(r.bytes_read for r in report.results))
        self._duration.observe(report.duration_ms / 1000)
        if report.binding_ts is not None:
            self._latency.observe(max(0, self._now() - report.binding_ts) / 1000)

    def render(self) -> str:
        """The text exposition format, as ``/metrics`` serves it."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host``:``port`` (0 picks a free port); returns the port."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _PipelineGauges(Collector):
    """Gauges read from the pipeline when scraped, so they are never older than the scrape."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        p = self.pipeline
        labels = ["pipeline"]
        lag = p.lag
        yield _gauge(
            "reclock_lag_offsets",
            "Offsets the source has that are not yet in every output.",
            labels,
            [([p.name], float("nan") if lag is None else lag)],
        )
        yield _gauge(
            "reclock_partition_lag_offsets",
            "Per partition: the source's upper at the last probe less the offset every output holds "
            "(not for file sources, whose partitions are files).",
            ["pipeline", "partition"],
            [([p.name, partition], n) for partition, n in _partition_lags(p)],
        )
        yield _gauge(
            "reclock_output_upper_ms",
            "Per output: its commit label + 1, the into time below which it holds every row.",
            ["pipeline", "output"],
            [([p.name, output], sink.upper) for output, sink in sorted(p.sinks.items())],
        )
        readable = CLOSED_UPPER if p.finished else p.resume_upper
        yield _gauge(
            "reclock_readable_upper_ms",
            "First into time with no consistent cut of this pipeline yet (2^63-1 once finished).",
            labels,
            [([p.name], readable)],
        )
        yield _gauge(
            "reclock_resume_upper_ms",
            "Into time below which every output is complete.",
            labels,
            [([p.name], p.resume_upper)],
        )
        yield _gauge(
            "reclock_health",
            "1 for the pipeline's current health.",
            ["pipeline", "health"],
            [([p.name, h.value], int(p.health is h)) for h in Health],
        )


def _partition_lags(pipeline: Pipeline) -> list[tuple[str, int]]:
    probe = pipeline.minter.last_probe
    if probe is None or isinstance(pipeline.source, FileStates):
        return []
    lags = partition_lags(pipeline.resume_frontier(), probe)  # the definition Pipeline.lag sums
    return sorted((encode_partition(partition), n) for partition, n in lags.items())


def _gauge(name: str, about: str, labels: list[str], samples: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, about, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family

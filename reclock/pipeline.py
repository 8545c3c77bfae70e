"""The pipeline driver: the batch loop of the design, one binding (or a short run of them) a batch.

One :meth:`Pipeline.step` first finishes any *pending* bindings (minted, but not yet in every
output: a failed or crashed batch), so a retry is exactly the same batch and a restart is a
catch-up. Only when every output is current does it move on:

1. **probe** the source's upper and cap it to ``max_batch`` (backpressure);
2. **mint** a binding ``(T, F)`` with ``T = max(now, remap upper)`` by compare-and-append; an idle
   source still advances time every ``idle_interval`` so quiet pipelines never hold back a
   consistent read; a bounded source whose end is bound gets a closing binding;
3. **plan**: the batch starts at the slowest output, ``lower = R(min_e upper_e - 1)``, and covers
   the pending bindings up to ``hi`` (as many as fit in ``max_batch``, at least one);
4. **write**: the data plane reads ``splits(lower, R(hi))``, stamps, drops what an output already
   holds and writes parquet files;
5. **commit** each output once, labelled ``hi``; an output that already holds ``hi`` is skipped;
6. **resume**: the resume frontier ``R(min_e upper_e - 1)`` goes to ``source.commit`` (advisory).

Every ``maintenance.every`` batches the step then maintains the tables (:mod:`reclock.maintenance`),
so their size, and with it the cost of a step and of a restart, stays bounded at any age.

A crash anywhere leaves durable bindings and some outputs ahead of others; the next step simply
starts again at step 1 with the same rule, which re-derives the same rows (determinism) and lets
labels skip what already landed (exactly once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pyarrow as pa

from reclock.dataplane import BatchPlan, DataPlane, LocalDataPlane, SplitResult, output_rows
from reclock.errors import (
    ConfigError,
    DefiniteSourceError,
    ErrorKind,
    FencedError,
    ReclockError,
    TransientError,
    describe,
)
from reclock.health import Health
from reclock.maintenance import MaintenanceReport, maintain
from reclock.minting import Interrupted, Minter
from reclock.persist.lake import NAME_PATTERN, Lake, sink_id
from reclock.persist.remap import RemapTable, Skip
from reclock.persist.sink import DataFile, OutputSink, discard_data_file, table_schema, write_data_file
from reclock.planning import in_split_order, plan_batch, without_skips
from reclock.resumption import is_finished, resume_frontier, resume_upper
from reclock.settings import Maintenance, Settings
from reclock.shaping import Shape, route_outputs
from reclock.sources.base import ERRORS, ERRORS_SCHEMA, Output, Source, error_batch
from reclock.time import Frontier, IntoTime, encode_partition, wall_clock_ms

__all__ = ["BatchFailed", "BatchReport", "BatchState", "Pipeline"]

log = logging.getLogger("reclock.pipeline")


class BatchState(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    NO_DATA = "No Data"


@dataclass
class BatchReport:
    """What one step did; ``binding_ts`` (the batch id) is ``None`` when there was nothing to do."""

    binding_ts: IntoTime | None = None
    state: BatchState = BatchState.NO_DATA
    rows: dict[str, int] = field(default_factory=dict)
    results: list[SplitResult] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    lower: Frontier = field(default_factory=Frontier)
    upper: Frontier = field(default_factory=Frontier)
    started_ms: int = 0
    duration_ms: int = 0
    error: str | None = None
    maintenance: MaintenanceReport | None = None  # when this step also maintained the tables

    @property
    def idle(self) -> bool:
        return self.binding_ts is None


class BatchFailed(ReclockError):
    """Some splits of a batch failed; nothing of the batch was committed."""

    def __init__(self, report: BatchReport) -> None:
        self.report = report
        failed = [r for r in report.results if r.error]
        self.kinds = {r.error_kind for r in failed}
        first = failed[0]
        super().__init__(
            f"batch {report.binding_ts}: {len(failed)} of {len(report.results)} splits failed; first: partition "
            f"{first.partition} offsets [{first.split.start}, {first.split.end}): {first.error}"
        )


class Pipeline:
    """Drives one source into its outputs; the single owner of its remap table and sinks."""

    def __init__(
        self,
        name: str,
        lake: str | Path | Lake,
        source: Source,
        *,
        data_plane: DataPlane | None = None,
        settings: Settings | None = None,
        maintenance: Maintenance | None = None,
        now: Callable[[], int] = wall_clock_ms,
        on_step: Callable[[str], None] | None = None,
        shapes: Sequence[Shape] = (),
    ) -> None:
        """``shapes``: outputs shaped from the source's (transforms, routes; see :mod:`reclock.shaping`)."""
        if not NAME_PATTERN.match(name):
            raise ConfigError("name", f"pipeline name {name!r} must be an identifier of at most 64 characters")
        self.name = name
        self.lake = lake if isinstance(lake, Lake) else Lake.at(lake)
        self.source = source
        self.data_plane = data_plane or LocalDataPlane()
        self.settings = settings or Settings()
        self.maintenance = maintenance or Maintenance()
        self._batches_since_maintenance = 0
        self.health = Health.STARTING
        self.last_error: str | None = None
        self._now = now
        self._on_step = on_step or (lambda step: None)
        self.outputs, self.routes = route_outputs(_outputs_of(source), shapes)
        self.remap = RemapTable(self.lake.remap_path(name), self.lake.store)
        self.minter = Minter(name, source, self.remap, self.settings, now)
        self.sinks = {
            output.name: OutputSink(
                self.lake.output_path(name, output.name),
                sink_id(name, output.name),
                table_schema(output.schema),
                envelope=output.envelope,
                key=output.key,
                store=self.lake.store,
            )
            for output in self.outputs.values()
        }

    # -- progress ------------------------------------------------------------------------------

    @property
    def resume_upper(self) -> IntoTime:
        """The slowest output's upper: everything below it is durable in every output."""
        return resume_upper(sink.upper for sink in self.sinks.values())

    def resume_frontier(self) -> Frontier:
        """``R(resume_upper - 1)``: where the source resumes, and what it may commit upstream."""
        return resume_frontier(self.remap.bindings, self.resume_upper)

    @property
    def finished(self) -> bool:
        """The source is closed and every output holds its closing binding."""
        return is_finished(self.remap.bindings, self.resume_upper)

    # -- the batch loop ------------------------------------------------------------------------

    @property
    def lag(self) -> int | None:
        """Offsets the last probe saw that are not yet in every output (``None`` before a probe)."""
        probe = self.minter.last_probe
        if probe is None:
            return None
        resume = self.resume_frontier()
        return 0 if resume.is_closed else resume.count_to(resume.join(probe))

    @property
    def pending(self) -> bool:
        """Some binding is durable but not yet in every output."""
        return self.resume_upper < self.remap.bindings.upper

    def step(self) -> BatchReport:
        """Catch up pending bindings, or else run steps 1 to 6 of the module docstring once."""
        return self._step(None)

    def _step(self, stop: threading.Event | None) -> BatchReport:
        if not self.pending:
            self.minter.probe_and_mint(stop)
            self._on_step("minted")
        report = self._run_batch()
        if not report.idle:
            self._batches_since_maintenance += 1
            if self.maintenance.every and self._batches_since_maintenance >= self.maintenance.every:
                report.maintenance = self._scheduled_maintenance()
        return report

    def maintain(self, *, optimize: bool = True, vacuum: bool = True) -> MaintenanceReport:
        """Compact the remap table, optimize and vacuum every output now (see :func:`maintain`)."""
        self._batches_since_maintenance = 0
        outputs = {name: sink.path for name, sink in self.sinks.items()}
        report = maintain(
            self.remap, outputs, self.resume_upper, self._now(), self.maintenance, optimize=optimize, vacuum=vacuum
        )
        self._on_step("maintained")
        return report

    def _scheduled_maintenance(self) -> MaintenanceReport | None:
        """The step's own maintenance: a failure is logged and retried at the next schedule.

        The batch before it is committed already, and nothing of the next depends on it, so a
        full disk or a racing writer here must not turn a good batch into a failed one.
        """
        try:
            report = self.maintain()
        except Exception as exc:  # maintenance is an optimisation: ingestion goes on without it
            self._batches_since_maintenance = 0
            log.warning(
                "pipeline %s: maintenance failed, retried in %d batches: %s",
                self.name,
                self.maintenance.every,
                describe(exc),
            )
            return None
        log.info(
            "pipeline %s: maintenance in %d ms: remap since %s, files merged %s, deleted %s",
            self.name,
            report.duration_ms,
            report.since,
            report.optimized,
            report.vacuumed,
        )
        return report

    def run(
        self,
        stop: threading.Event | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_health: Callable[[Pipeline], None] | None = None,
    ) -> None:
        """Step until finished or ``stop`` is set; the in-flight batch always completes first.

        Failures, by kind (see ``docs/operations.md``):

        * transient (:class:`TransientError`: broker away, timeouts): health ``stalled``, retried
          with capped backoff for as long as it lasts; never skips data;
        * a failed batch (bad data, a corrupt file): retried whole ``max_retries`` times, then the
          pipeline fails (``stop_on_error``) or records the failed ranges as skipped, durably,
          and goes on without them;
        * another driver moved an output (:class:`FencedError`): re-read what is durable, re-plan;
        * definite (:class:`DefiniteSourceError`) or a broken invariant: fails at once.

        Health is updated before observers hear of a batch (``on_batch``, also for failed
        attempts) or of a failure that has no batch (``on_health``), so they never show a stale one.
        """
        try:
            self._loop(stop or threading.Event(), on_batch, on_health)
        finally:
            self.source.close()

    def _loop(
        self,
        stop: threading.Event,
        on_batch: Callable[[BatchReport], None] | None,
        on_health: Callable[[Pipeline], None] | None,
    ) -> None:
        attempts = stalls = 0

        def observe(report: BatchReport | None) -> None:
            if report is not None and on_batch is not None:
                on_batch(report)
            if on_health is not None:
                on_health(self)

        while not stop.is_set() and not self.finished:
            try:
                report = self._step(stop)
            except Interrupted:
                break
            except BatchFailed as exc:
                data = ErrorKind.DATA in exc.kinds
                spent = data and attempts >= self.settings.max_retries
                if exc.kinds & {ErrorKind.INVARIANT, ErrorKind.DEFINITE} or (spent and self.settings.stop_on_error):
                    self._fail(exc)
                    observe(exc.report)
                    raise
                holders = [name for name, sink in self.sinks.items() if sink.upper > exc.report.binding_ts]
                if spent and holders:
                    # A crash between two outputs' commits, then the range turned unreadable: the
                    # rows already landed, so recording the range as skipped would count them twice.
                    self._fail(
                        DefiniteSourceError(
                            f"batch {exc.report.binding_ts} cannot be skipped: output {holders[0]!r} already holds "
                            f"it, and its source range can no longer be read to finish the others ({exc})"
                        )
                    )
                    observe(exc.report)
                    raise
                attempts += 1 if data else 0
                if data and attempts > self.settings.max_retries:
                    self._mark_stalled(exc)
                    observe(exc.report)
                    try:
                        self._skip(exc.report, attempts)
                    except TransientError as fault:  # the lake refused the skip: retry the batch later
                        stalls += 1
                        self._mark_stalled(fault)
                        observe(None)
                        self._backoff(stop, stalls)
                        continue
                    attempts = 0
                    continue
                stalls += 1
                self._mark_stalled(exc)
                observe(exc.report)
                self._backoff(stop, stalls)
                continue
            except (DefiniteSourceError, AssertionError) as exc:
                self._fail(exc)
                observe(None)
                raise
            except Exception as exc:
                stalls += 1
                if isinstance(exc, FencedError):
                    log.warning("pipeline %s: %s; re-reading the remap table and outputs", self.name, exc)
                    self._resync()
                elif not isinstance(exc, TransientError) and stalls > self.settings.max_retries:
                    self._fail(exc)
                    observe(None)
                    raise
                self._mark_stalled(exc)
                observe(None)
                self._backoff(stop, stalls)
                continue
            attempts = stalls = 0
            self.health = Health.RUNNING
            self.last_error = None
            observe(report)
            if report.idle and not self.finished:
                stop.wait(self.settings.batch_interval)
        self.health = Health.STOPPED
        observe(None)

    # -- steps ---------------------------------------------------------------------------------

    def _run_batch(self) -> BatchReport:
        # Step 3: plan from the slowest output.
        bindings = self.remap.bindings
        lo = self.resume_upper
        batch = plan_batch(bindings, lo, self.settings.max_batch)
        if batch is None:
            return BatchReport()
        hi, lower, upper = batch.hi, batch.lower, batch.upper
        moved = batch.moved
        skips = [skip for skip in self.remap.skips if lo <= skip.binding_ts <= hi]
        splits = without_skips(self.source.splits(lower, upper), skips) if moved else []
        plan = BatchPlan(
            source=self.source,
            stamper=bindings.stamper(after=lo - 1 if lo else None, partitions=moved),
            uppers={name: sink.upper for name, sink in self.sinks.items()},
            roots={name: str(sink.write_root) for name, sink in self.sinks.items()},
            schemas={name: sink.write_schema for name, sink in self.sinks.items()},
            file_rows=self.settings.file_rows,
            envelopes={o.name: (o.envelope, o.key) for o in self.outputs.values() if o.envelope != "append"},
            store=self.lake.store,
            routes=self.routes,
        )
        # Step 4: write.
        started = wall_clock_ms()
        results = in_split_order(self.data_plane.run(plan, splits), splits)
        report = BatchReport(
            hi, BatchState.SUCCEEDED, results=results, skips=skips, lower=lower, upper=upper, started_ms=started
        )
        if any(r.error for r in results):
            for r in results:
                for f in r.files:
                    discard_data_file(plan.roots[f.output], f, plan.store)
            report.state = BatchState.FAILED
            report.duration_ms = wall_clock_ms() - started
            failure = BatchFailed(report)
            report.error = str(failure)
            raise failure
        files = [f for r in results for f in r.files]
        if skips:
            files += self._skipped_rows(plan, skips)
        self._on_step("written")
        # Step 5: commit each output once.
        by_output: dict[str, list[DataFile]] = {name: [] for name in self.sinks}
        for f in files:
            by_output[f.output].append(f)
        for name, sink in self.sinks.items():
            if sink.upper <= hi:
                sink.commit(by_output[name], hi, planned_upper=plan.uppers[name])
            self._on_step(f"committed:{name}")
        # Step 6: tell the source how far every output holds.
        self.source.commit(self.resume_frontier())
        self._on_step("resumed")
        report.rows = {name: sum(f.num_records for f in fs) for name, fs in by_output.items()}
        report.duration_ms = wall_clock_ms() - started
        return report

    def _skipped_rows(self, plan: BatchPlan, skips: list[Skip]) -> list[DataFile]:
        """One ``_errors`` row per skipped range, stamped like the range's first record."""
        partitions = pa.array([encode_partition(s.partition) for s in skips], pa.string())
        starts = pa.array([s.start for s in skips], pa.int64())
        into = plan.stamper.into_times(partitions, starts)
        keep = into >= plan.uppers[ERRORS]
        if not keep.any():
            return []
        messages = [
            f"offsets [{s.start}, {s.end}) of partition {encode_partition(s.partition)} skipped: {s.reason}"
            for s in skips
        ]
        reasons = error_batch(partitions, starts, ["skipped"] * len(skips), messages, [None] * len(skips))
        table = output_rows(reasons, into, plan.schemas[ERRORS]).filter(pa.array(keep))
        return [write_data_file(plan.roots[ERRORS], ERRORS, table, plan.store)]

    def _skip(self, report: BatchReport, attempts: int) -> None:
        """Give up the failed splits of a batch, durably, before anything of it commits."""
        skips = [
            Skip(
                report.binding_ts,
                r.split.partition,
                r.split.start,
                r.split.end,
                f"{r.error} (failed {attempts} attempts)",
            )
            for r in report.results
            if r.error
        ]
        recorded = self.remap.record_skips(skips)
        log.warning(
            "pipeline %s: skipped %d ranges of batch %s after %d attempts",
            self.name,
            len(recorded),
            report.binding_ts,
            attempts,
        )

    def _resync(self) -> None:
        self.remap.sync()
        for sink in self.sinks.values():
            sink.refresh()

    def _mark_stalled(self, exc: BaseException) -> None:
        self.health = Health.STALLED
        self.last_error = describe(exc)
        log.warning("pipeline %s: stalled, will retry: %s", self.name, self.last_error)

    def _backoff(self, stop: threading.Event, stalls: int) -> None:
        stop.wait(min(self.settings.max_backoff, self.settings.retry_backoff * 2 ** (stalls - 1)))

    def _fail(self, exc: BaseException) -> None:
        self.health = Health.FAILED
        self.last_error = describe(exc)
        log.error("pipeline %s failed: %s", self.name, self.last_error)


def _outputs_of(source: Source) -> dict[str, Output]:
    outputs: dict[str, Output] = {}
    for output in source.outputs():
        if not NAME_PATTERN.match(output.name) or output.name.startswith("_"):
            raise ConfigError("outputs", f"output name {output.name!r} must be an identifier not starting with '_'")
        if output.name in outputs:
            raise ConfigError("outputs", f"output {output.name!r} is declared twice")
        if output.envelope not in ("append", "upsert", "debezium"):
            raise ConfigError("outputs", f"output {output.name!r}: unknown envelope {output.envelope!r}")
        if output.envelope != "append" and not output.key:
            raise ConfigError("outputs", f"output {output.name!r}: a {output.envelope} output needs key columns")
        missing = [k for k in output.key if k not in output.schema.names]
        if missing:
            raise ConfigError("outputs", f"output {output.name!r}: key columns {missing} are not in its schema")
        outputs[output.name] = output
    outputs[ERRORS] = Output(ERRORS, ERRORS_SCHEMA)
    return outputs

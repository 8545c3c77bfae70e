"""The pipeline driver: the batch loop of the design, one binding (or a short run of them) a batch.

One :meth:`Pipeline.step` first finishes any *pending* bindings (minted, but not yet in every
output: a failed or crashed batch), so a retry is exactly the same batch and a restart is a
catch-up. Only when every output is current does it move on:

1. **probe** the source's upper and cap it to ``max_batch`` (backpressure);
2. **mint** a binding ``(T, F)`` with ``T = max(now, remap upper)`` by compare-and-append; an idle
   source still advances time every ``idle_interval`` so quiet pipelines never hold back a
   consistent read; a bounded source whose end is bound gets a closing binding;
3. **plan**: the batch starts at the slowest output, ``lower = R(min_e upper_e - 1)``, and covers
   the pending bindings (as many as fit in ``max_batch``, at least one) up to ``binding_ts``, its id;
4. **write**: the data plane reads ``splits(lower, R(binding_ts))`` and the ranges redriven at these
   bindings (:mod:`reclock.runtime.redrives`), stamps, drops what an output already holds and
   writes parquet files;
5. **commit** each output once, labelled ``binding_ts``; an output that already holds it is skipped;
6. **resume**: the resume frontier ``R(min_e upper_e - 1)`` goes to ``source.commit`` (advisory).

Every ``maintenance.every`` batches the step then maintains the tables (:mod:`reclock.runtime.maintenance`),
so their size, and with it the cost of a step and of a restart, stays bounded at any age.

A crash anywhere leaves durable bindings and some outputs ahead of others; the next step simply
starts again at step 1 with the same rule, which re-derives the same rows (determinism) and lets
labels skip what already landed (exactly once).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from reclock.errors import (
    ConfigError,
    ContractError,
    DefiniteSourceError,
    ErrorKind,
    FencedError,
    TransientError,
    describe,
)
from reclock.persist.evolution import SchemaEvolutionError, refuse_new_fields
from reclock.persist.lake import NAME_PATTERN, Lake, sink_id
from reclock.persist.layout import OutputLayout, output_layouts
from reclock.persist.lease import LeaseLost
from reclock.persist.remap import REREAD_START, RemapTable, Skip
from reclock.persist.sink import DataFile, OutputSink, discard_data_file, table_schema, write_data_file
from reclock.runtime.ahead import landed as ahead_landed
from reclock.runtime.ahead import results as ahead_results
from reclock.runtime.failures import Verdict, decide
from reclock.runtime.health import Health, after_batch
from reclock.runtime.logs import BATCH_ID, batch_scope
from reclock.runtime.maintenance import MaintenanceReport, maintain_tables
from reclock.runtime.minting import Interrupted, Minter
from reclock.runtime.outputs import awaited_shapes, awaited_windows, joined_output, layouts_of, outputs_of
from reclock.runtime.planes import DataPlane, LocalDataPlane, keep_warm, task_runner
from reclock.runtime.planning import BatchRange, in_split_order, plan_batch, without_skips
from reclock.runtime.redrives import redrive_splits
from reclock.runtime.reports import FILTERED, BatchFailed, BatchReport, BatchState, filtered_json, ms_since
from reclock.runtime.rows import output_rows
from reclock.runtime.settings import Maintenance, Settings
from reclock.runtime.shaping import Route, Shape, route_outputs
from reclock.runtime.task import BatchPlan
from reclock.runtime.windowing import Windows
from reclock.runtime.windows import Window, check_windows
from reclock.sources.base import (
    ERRORS,
    DistinctInserts,
    GrowsOutputs,
    LandedAhead,
    LandsAhead,
    Output,
    RunsTasks,
    Source,
    Split,
    error_batch,
)
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import Frontier, IntoTime, Partition, encode_partition, wall_clock_ms
from reclock.timeline.lag import total_lag
from reclock.timeline.resume import is_finished, resume_frontier, resume_upper

__all__ = ["BatchFailed", "BatchReport", "BatchState", "Pipeline"]

log = logging.getLogger("reclock.pipeline")

#: The longest a pipeline waits between batches without giving its data plane a chance to keep
#: its workers (Spark checks for idle ones every 10 s and stops them after a minute).
WARM_POLL_S = 10.0


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
        windows: Sequence[Window] = (),
        layouts: Mapping[str, OutputLayout] | None = None,
        fence: Callable[[], None] | None = None,
        shapes: Sequence[Shape] = (),
    ) -> None:
        """``shapes``: outputs shaped from the source's (transforms, routes; see :mod:`reclock.runtime.shaping`).
        ``fence`` is called before every durable write (a binding, a commit, skips, maintenance)
        and raises :class:`~reclock.persist.lease.LeaseLost` once this driver no longer owns the
        pipeline: the job's lease check, so a driver that lost its lease stops instead of writing."""
        if not NAME_PATTERN.match(name):
            raise ConfigError("name", f"pipeline name {name!r} must be an identifier of at most 64 characters")
        self.name = name
        self.lake = lake if isinstance(lake, Lake) else Lake.at(lake)
        self.source = source
        self.data_plane = data_plane or LocalDataPlane()
        if isinstance(source, RunsTasks):
            source.use_tasks(task_runner(self.data_plane))
        if isinstance(source, LandsAhead):
            source.use_lander(self._land_ahead)
        self.settings = settings or Settings()
        self.maintenance = maintenance or Maintenance()
        self._batches_since_maintenance = 0
        self.health = Health.STARTING
        self.last_error: str | None = None
        self._now = now
        self._on_step = on_step or (lambda step: None)
        self._on_start: Callable[[BatchReport], None] = lambda report: None
        self._fence = fence or (lambda: None)
        declared = outputs_of(source)
        shaped, self._awaited_shapes = awaited_shapes(source, declared, shapes)
        self.outputs, self.routes = route_outputs(declared, shaped)
        self.layouts, self._awaited_layouts = layouts_of(source, self.outputs, layouts or {}, self._awaited_shapes)
        self.remap = RemapTable(self.lake.remap_path(name), self.lake.store)
        self.minter = Minter(name, source, self.remap, self.settings, now)
        self.sinks = {output.name: self._sink(output) for output in self.outputs.values()}
        windows, self._awaited_windows = awaited_windows(source, self.outputs, windows, self._awaited_shapes)
        self.windows = Windows(self.lake, name, windows, self.outputs, on_commit=self._on_step)
        self._born_outputs()

    def _sink(self, output: Output) -> OutputSink:
        return OutputSink(
            self.lake.output_path(self.name, output.name),
            sink_id(self.name, output.name),
            table_schema(output.schema, layout=self.layouts.get(output.name)),
            envelope=output.envelope,
            key=output.key,
            store=self.lake.store,
            layout=self.layouts.get(output.name),
        )

    def _born_outputs(self) -> None:
        """Outputs the source gained while running (:class:`~reclock.sources.base.GrowsOutputs`),
        each born at the binding ``T`` that first holds offset 0 of its partition.

        Called when the pipeline is built and before every batch is planned, so an output is born
        before any batch reaching ``T`` runs. Step 1: what the definition awaited for it (its
        shaping and routes, the layouts of the outputs they make, the windows over them), checked
        against its columns as ``create`` checks a declared output's: a definition that cannot
        apply is a definite error naming its field, before anything of the output is written, so a
        corrected definition applies at the next start. Step 2: the sinks and their tables. Step
        3: an empty commit labelled ``T - 1``, so each new output's upper is ``T``: the resume
        frontier (the least upper) is not dragged back to the start, and a read as of a time
        before ``T`` finds the output empty. Step 4: its windows, closed from then on. A crash
        between steps 2 and 3 leaves a table at upper 0 that the next call finishes (until then
        the readable upper is 0: nothing wrong is readable). A source that has not bound the
        partition yet has an output that is not born yet: nothing happens.
        """
        if not isinstance(self.source, GrowsOutputs):
            return
        bindings = self.remap.bindings
        for joined in self.source.joined_outputs():
            if joined.output.name in self.sinks:
                continue
            born = bindings.reclock(joined.partition, 0)
            if born is None:
                continue
            # Step 1: the outputs it makes, shaped and routed, with their layouts and windows.
            outputs, routes, layouts, windows = self._awaited(joined_output(joined.output, self.outputs))
            self.layouts.update(layouts)
            for output in outputs.values():
                # Step 2: the sink, its table created (or found, after a crash).
                sink = self._sink(output)
                # Step 3: its upper at the birth, by one empty labelled commit.
                if sink.upper < born:
                    self._fence()
                    sink.commit([], born - 1, planned_upper=sink.upper)
                self.outputs[output.name] = output
                self.sinks[output.name] = sink
                log.info("pipeline %s: output %s joined, born at %d", self.name, output.name, born)
            self.routes.update(routes)
            # Step 4: its windows, closed from now on like every other.
            self.windows.add(windows, self.outputs)
            self._awaited_windows = tuple(w for w in self._awaited_windows if w not in windows)
            self._on_step(f"born:{joined.output.name}")

    def _awaited(
        self, output: Output
    ) -> tuple[dict[str, Output], dict[str, tuple[Route, ...]], dict[str, OutputLayout], list[Window]]:
        """A joined ``output`` with what the definition awaited for it: the outputs it lands in
        (itself, shaped or not, and those its routes make), its routes, their layouts, and the
        windows over them (and ``from`` those), checked as ``create`` checks a declared output's."""
        shapes = [shape for shape in self._awaited_shapes if shape.source_output == output.name]
        try:
            outputs, routes = route_outputs({output.name: output}, shapes)
            taken = [name for name in outputs if name in self.outputs]
            if taken:
                raise ConfigError(f"outputs.{taken[0]}", "is an output already")
            layouts = {name: self._awaited_layouts[name] for name in outputs if name in self._awaited_layouts}
            output_layouts(outputs, layouts)
            windows: list[Window] = []
            for window in self._awaited_windows:
                if window.output in outputs or window.from_window in {w.name for w in windows}:
                    windows.append(window)
            check_windows([*self.windows.defined, *windows], [*self.outputs.values(), *outputs.values()])
        except ConfigError as exc:
            raise DefiniteSourceError(
                f"{exc} (output {output.name!r} joined the source; correct the definition: reclock create --replace)"
            ) from None
        return outputs, routes, layouts, windows

    # -- progress ------------------------------------------------------------------------------

    @property
    def resume_upper(self) -> IntoTime:
        """The slowest output's upper: everything below it is durable in every output."""
        return resume_upper(sink.upper for sink in self.sinks.values())

    def resume_frontier(self) -> Frontier:
        """``R(resume_upper - 1)``: where the source resumes, and what it may commit upstream.

        Like :attr:`finished`, it depends on bindings the outputs hold only, so it reads the
        remap view without re-reading it: no lake I/O, so observers and the loop's own test ask
        it while the store is away without meeting a storage error outside the loop's handling.
        """
        return resume_frontier(self.remap.held_bindings, self.resume_upper)

    @property
    def finished(self) -> bool:
        """The source is closed and every output holds its closing binding (no lake I/O)."""
        return is_finished(self.remap.held_bindings, self.resume_upper)

    # -- the batch loop ------------------------------------------------------------------------

    @property
    def lag(self) -> int | None:
        """Offsets the last probe saw not yet in every output (``None`` before a probe): the one
        definition of lag (:mod:`reclock.timeline.lag`), which the metrics and ``reclock offsets`` share."""
        probe = self.minter.last_probe
        return None if probe is None else total_lag(self.resume_frontier(), probe)

    @property
    def pending(self) -> bool:
        """Some binding is durable but not yet in every output."""
        return self.resume_upper < self.remap.bindings.upper

    @property
    def windows_current(self) -> bool:
        """Every window the outputs' uppers close is in its table (see :mod:`reclock.runtime.windowing`)."""
        return self.windows.current(self._uppers(), self.finished)

    def close_windows(self) -> int:
        """Emit every window whose end its output's upper has passed; how many had rows."""
        return self.windows.close(self._uppers(), self.finished)

    def _uppers(self) -> dict[str, IntoTime]:
        return {name: sink.upper for name, sink in self.sinks.items()}

    def step(self) -> BatchReport:
        """Close due windows, then catch up pending bindings or else run steps 1 to 6 once."""
        return self._step(None)

    def _step(self, stop: threading.Event | None) -> BatchReport:
        self._fence()
        # What an earlier step could not close is closed first; a failure here fails the step.
        self.close_windows()
        minted: dict[str, int] = {}
        if not self.pending:
            minted = self.minter.probe_and_mint(stop)
            self._on_step("minted")
        with batch_scope():  # log lines of this step name its batch (set once it is planned)
            report = self._run_batch()
        report.phases = {**minted, **report.phases}
        if not report.idle:
            # At once (a stop loses none), and before optimize merges the batch's small files.
            self.windows.close_after_batch(self._uppers(), self.finished)
            self._batches_since_maintenance += 1
            if self.maintenance.every and self._batches_since_maintenance >= self.maintenance.every:
                report.maintenance = self._scheduled_maintenance()
        return report

    def maintain(self, *, optimize: bool = True, vacuum: bool = True) -> MaintenanceReport:
        """Compact the remap table, optimize and vacuum every output now (see :func:`maintain_tables`)."""
        self._batches_since_maintenance = 0
        if vacuum and self._landing_ahead():
            log.info("pipeline %s: not vacuuming while files landed ahead of their binding wait for it", self.name)
            vacuum = False
        outputs = {name: sink.path for name, sink in self.sinks.items()}
        outputs |= self.windows.paths()  # a commit per pass too
        report = maintain_tables(
            self.remap,
            outputs,
            self.resume_upper,
            self._now(),
            self.maintenance,
            optimize=optimize,
            vacuum=vacuum,
            fence=self._fence,
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
        except LeaseLost:
            raise
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
        on_start: Callable[[BatchReport], None] | None = None,
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
        ``on_start`` hears of each batch once it is planned, before anything is read (state
        ``In Progress``), so a slow batch is visible while it runs.
        """
        self._on_start = on_start or (lambda report: None)
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
            try:
                if report is not None and on_batch is not None:
                    on_batch(report)
                if on_health is not None:
                    on_health(self)
            except TransientError as exc:  # an observer that cannot reach the lake ends no loop
                log.warning("pipeline %s: could not report its state: %s", self.name, describe(exc))

        while not stop.is_set() and not (self.finished and self.windows_current):
            try:
                report = self._step(stop)
            except Interrupted:
                break
            except BatchFailed as exc:
                holders = [name for name, sink in self.sinks.items() if sink.upper > exc.binding_ts]
                decision = decide(exc.kinds, attempts, self.settings, holders)
                if decision.verdict is Verdict.FAIL:
                    self._fail(exc)
                    observe(exc.report)
                    raise
                if decision.verdict is Verdict.FAIL_HELD:
                    # A crash between two outputs' commits, then the range turned unreadable: the
                    # rows already landed, so recording the range as skipped would count them twice.
                    self._fail(
                        DefiniteSourceError(
                            f"batch {exc.report.binding_ts} cannot be skipped: output {decision.held_by!r} already "
                            f"holds it, and its source range can no longer be read to finish the others ({exc})"
                        )
                    )
                    observe(exc.report)
                    raise
                attempts = decision.attempts
                if decision.verdict is Verdict.SKIP:
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
            except (DefiniteSourceError, AssertionError, LeaseLost) as exc:
                self._fail(exc)
                observe(None)
                raise
            except Exception as exc:
                stalls += 1
                if isinstance(exc, FencedError):
                    log.warning("pipeline %s: %s; re-reading the remap table and outputs", self.name, exc)
                    try:
                        self._resync()
                    except TransientError as fault:  # the next commit meets the moved outputs again: re-read then
                        exc = fault
                elif not isinstance(exc, TransientError) and stalls > self.settings.max_retries:
                    self._fail(exc)
                    observe(None)
                    raise
                self._mark_stalled(exc)
                observe(None)
                self._backoff(stop, stalls)
                continue
            attempts = stalls = 0
            now = (self.health, self.last_error)
            self.health, self.last_error = after_batch(self.name, report, self.sinks[ERRORS].path, self.lake.store, now)
            observe(report)
            if report.idle and not self.finished:
                self._rest(stop, self.settings.batch_interval)
            else:
                keep_warm(self.data_plane)  # batches small enough for the driver leave Spark idle too
        self.health = Health.STOPPED
        observe(None)

    # -- steps ---------------------------------------------------------------------------------

    def _run_batch(self) -> BatchReport:
        # Outputs the source gained are born before a batch reaches their binding.
        self._born_outputs()
        # Step 3: plan from the slowest output.
        clock = time.monotonic()
        bindings = self.remap.bindings
        lo = self.resume_upper
        batch = plan_batch(bindings, lo, self.settings.max_batch)
        if batch is None:
            return BatchReport()
        binding_ts, lower, upper = batch.binding_ts, batch.lower, batch.upper
        BATCH_ID.set(binding_ts)
        moved = batch.moved
        skips = [skip for skip in self.remap.skips if lo <= skip.binding_ts <= binding_ts]
        splits = without_skips(self.source.splits(lower, upper), skips) if moved else []
        # Records from _errors read again, in the batch of the binding they were redriven at.
        splits += redrive_splits(self.source, bindings, self.remap.redrives, skips, between=(lo, binding_ts))
        ahead = self._landed_ahead(batch)  # landed before its binding: its files are the batch's
        appends, landed = ahead_results(ahead, splits) if ahead is not None else (None, None)
        plan = self._plan(bindings, lo, moved, splits, appends)
        started = wall_clock_ms()
        report = BatchReport(
            binding_ts, BatchState.IN_PROGRESS, skips=skips, lower=lower, upper=upper, started_ms=started
        )
        report.phases["plan"], clock = ms_since(clock)
        self._on_start(report)
        # Step 4: write (the probe may have been long: a driver that lost its lease meanwhile
        # writes no data file either).
        self._fence()
        results = landed if landed is not None else in_split_order(self.data_plane.run(plan, splits), splits)
        report.state, report.results = BatchState.SUCCEEDED, results
        report.phases["read"], clock = ms_since(clock)
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
        try:
            refuse_new_fields(
                self.name, binding_ts, {n: (self.layouts[n], fs) for n, fs in by_output.items() if n in self.layouts}
            )
        except SchemaEvolutionError as exc:
            for f in files:
                discard_data_file(plan.roots[f.output], f, plan.store)
            report.state = BatchState.FAILED
            report.error = str(exc)
            raise
        metadata = {FILTERED: filtered_json(results)}
        for name, sink in self.sinks.items():
            if sink.upper <= binding_ts:
                self._fence()
                sink.commit(
                    by_output[name],
                    binding_ts,
                    planned_upper=plan.uppers[name],
                    metadata=metadata,
                    append=name in plan.appends,
                )
            self._on_step(f"committed:{name}")
        # Step 6: tell the source how far every output holds.
        self.source.commit(self.resume_frontier())
        self._on_step("resumed")
        report.phases["commit"], _ = ms_since(clock)
        report.rows = {name: sum(f.num_records for f in fs) for name, fs in by_output.items()}
        report.duration_ms = wall_clock_ms() - started
        return report

    def _plan(
        self,
        bindings: Bindings,
        lo: IntoTime,
        moved: Sequence[Partition],
        splits: Sequence[Split],
        appends: frozenset[str] | None = None,
    ) -> BatchPlan:
        """The tasks' plan of a batch from ``lo`` over ``splits`` stamped by ``bindings``: the
        same for a batch and for its landing ahead (:mod:`reclock.runtime.ahead`)."""
        if appends is None:
            appends = self._appends(splits)
        return BatchPlan(
            source=self.source,
            stamper=bindings.stamper(after=lo - 1 if lo else None, partitions=moved),
            uppers={name: sink.upper for name, sink in self.sinks.items()},
            roots={name: str(sink.path if name in appends else sink.write_root) for name, sink in self.sinks.items()},
            schemas={name: sink.schema if name in appends else sink.write_schema for name, sink in self.sinks.items()},
            file_rows=self.settings.file_rows,
            envelopes={o.name: (o.envelope, o.key) for o in self.outputs.values() if o.envelope != "append"},
            store=self.lake.store,
            layouts=self.layouts,
            added={name: sink.added for name, sink in self.sinks.items() if sink.added},
            routes=self.routes,
            appends=appends,
        )

    def _land_ahead(self, upper: Frontier, splits: Sequence[Split]) -> LandedAhead:
        """The :data:`~reclock.sources.base.Lander` this pipeline gives a source that lands ahead:
        the batch binding ``upper`` at a reserved time, run now (:mod:`reclock.runtime.ahead`).

        Called in a probe, when every binding is in every output: the batch it lands is the next
        one, from the resume upper, with the sinks as they are now.
        """
        bindings = self.remap.bindings
        if self.pending:
            raise ContractError("a source may land ahead only when every binding is in every output")
        into_ts = max(self._now(), bindings.upper)
        bound = copy.deepcopy(bindings)
        bound.mint(into_ts, upper)
        appends = self._appends(splits)
        moved = BatchRange(into_ts, bindings.frontier, upper).moved
        plan = self._plan(bound, self.resume_upper, moved, splits, appends)
        self._fence()
        done = in_split_order(self.data_plane.run(plan, splits), splits)
        failed = next((r for r in done if r.error), None)
        if failed is not None:
            for r in done:
                for f in r.files:
                    discard_data_file(plan.roots[f.output], f, plan.store)
            kind = TransientError if failed.error_kind is ErrorKind.TRANSIENT else DefiniteSourceError
            raise kind(f"a batch landed ahead of its binding failed: {failed.error}")
        self._on_step("landed-ahead")
        return ahead_landed(into_ts, upper, appends, done)

    def _landed_ahead(self, batch: BatchRange) -> LandedAhead | None:
        """The source's landing ahead if it is this batch's; one the batch would cover otherwise
        than whole breaks the planning's promise (the landing is minted alone, as the next binding)."""
        if not isinstance(self.source, LandsAhead):
            return None
        ahead = self.source.landed_ahead()
        if ahead is None or not (self.resume_upper <= ahead.into_ts <= batch.binding_ts):
            return None
        if ahead.into_ts != batch.binding_ts or ahead.upper != batch.upper:
            raise ContractError(
                f"batch {batch.binding_ts} covers the landing ahead at {ahead.into_ts} with other bindings"
            )
        return ahead

    def _landing_ahead(self) -> bool:
        """Files a source landed ahead are not in every output yet: referenced by no table, so a
        vacuum (``full``: it removes files no version references) would delete them."""
        if not isinstance(self.source, LandsAhead):
            return False
        ahead = self.source.landed_ahead()
        return ahead is not None and ahead.into_ts >= self.resume_upper

    def _appends(self, splits: Sequence[Split]) -> frozenset[str]:
        """The MERGE outputs this batch appends to instead: those the source promises only
        inserts of distinct keys in ``splits`` (:class:`~reclock.sources.base.DistinctInserts`,
        a database's initial snapshot) whose tables hold no row yet; a MERGE of such a batch into
        such a table could only insert every record. Shaped outputs are never among them."""
        if not isinstance(self.source, DistinctInserts):
            return frozenset()
        promised = self.source.distinct_inserts(splits)
        return frozenset(
            name
            for name in promised
            if name in self.sinks and name not in self.routes and self.sinks[name].can_append()
        )

    def _skipped_rows(self, plan: BatchPlan, skips: list[Skip]) -> list[DataFile]:
        """One ``_errors`` row per skipped range, stamped like the range's first record (none for
        the offsets before a re-read's start: they were never the re-read's to load)."""
        skips = [s for s in skips if s.reason != REREAD_START]
        if not skips:
            return []
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
        assert report.binding_ts is not None, "only a planned batch fails"
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
        self._fence()
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

    def _rest(self, stop: threading.Event, seconds: float) -> None:
        """Wait ``seconds`` between batches (or until ``stop``), keeping the data plane's workers
        meanwhile (:func:`~reclock.runtime.planes.keep_warm`): a wait longer than Spark's idle
        minute would otherwise cost the next batch on Spark new Python workers."""
        end = time.monotonic() + seconds
        while True:
            keep_warm(self.data_plane)
            left = end - time.monotonic()
            if left <= 0 or stop.wait(min(left, WARM_POLL_S)):
                return

    def _backoff(self, stop: threading.Event, stalls: int) -> None:
        stop.wait(min(self.settings.max_backoff, self.settings.retry_backoff * 2 ** (stalls - 1)))

    def _fail(self, exc: BaseException) -> None:
        self.health = Health.FAILED
        self.last_error = describe(exc)
        log.error("pipeline %s failed (state Error): %s", self.name, self.last_error)

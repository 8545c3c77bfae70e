"""The pipeline: one source into its outputs, a batch at a time, through the stages of the design.

One :meth:`Pipeline.step` first finishes any *pending* bindings (minted, but not yet in every
output: a failed or crashed batch), so a retry is exactly the same batch and a restart is a
catch-up. Only when every output is current does it move on:

1. **probe** the source's upper and cap it to ``max_batch`` (backpressure), doing first what the
   probe asks (a landing ahead, work on the tasks);
2. **mint** a binding ``(T, F)`` with ``T = max(now, remap upper)`` by compare-and-append; an idle
   source still advances time every ``idle_interval`` so quiet pipelines never hold back a
   consistent read; a bounded source whose end is bound gets a closing binding
   (:mod:`reclock.runtime.minting`);

then the batch, a value (:class:`~reclock.runtime.batch.Batch`) through four stages:

3. **plan** (:mod:`reclock.runtime.plan`): the batch starts at the slowest output,
   ``lower = R(min_e upper_e - 1)``, and covers the pending bindings (as many as fit in
   ``max_batch``, at least one) up to ``binding_ts``, its id;
4. **land** (:mod:`reclock.runtime.land`): the data plane reads ``splits(lower, R(binding_ts))`` and
   the ranges redriven at these bindings, stamps, drops what an output already holds and writes
   parquet files;
5. **commit** (:mod:`reclock.runtime.commit`) each output once, labelled ``binding_ts``; an output
   that already holds it is skipped;
6. **resume** (:mod:`reclock.runtime.resume`): the resume frontier ``R(min_e upper_e - 1)`` goes to
   ``source.commit`` (advisory).

:meth:`Pipeline.run` is the :class:`~reclock.runtime.loop.BatchLoop` over steps: retries, backoff,
health and stop. Every ``maintenance.every`` batches the step then maintains the tables
(:mod:`reclock.runtime.maintenance`), so their size, and with it the cost of a step and of a
restart, stays bounded at any age.

A crash anywhere leaves durable bindings and some outputs ahead of others; the next step simply
starts again at step 1 with the same rule, which re-derives the same rows (determinism) and lets
labels skip what already landed (exactly once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from reclock.errors import ConfigError, describe
from reclock.persist.lake import NAME_PATTERN, Lake
from reclock.persist.layout import OutputLayout
from reclock.persist.lease import LeaseLost
from reclock.persist.remap import RemapTable
from reclock.runtime.ahead import Landings
from reclock.runtime.births import born_outputs
from reclock.runtime.commit import commit
from reclock.runtime.driver import Awaited, Driver, make_sink
from reclock.runtime.health import Health
from reclock.runtime.land import land
from reclock.runtime.logs import batch_scope
from reclock.runtime.loop import BatchLoop
from reclock.runtime.maintenance import MaintenanceReport, maintain_tables
from reclock.runtime.minting import Minter
from reclock.runtime.outputs import awaited_shapes, awaited_windows, layouts_of, outputs_of
from reclock.runtime.plan import plan
from reclock.runtime.planes import DataPlane, LocalDataPlane
from reclock.runtime.reports import BatchFailed, BatchReport, BatchState
from reclock.runtime.resume import resume
from reclock.runtime.settings import Maintenance, Settings
from reclock.runtime.shaping import Shape, route_outputs
from reclock.runtime.windowing import Windows
from reclock.runtime.windows import Window
from reclock.sources.base import AsksFirst, Source
from reclock.timeline.frontier import Frontier, IntoTime, wall_clock_ms
from reclock.timeline.lag import total_lag

__all__ = ["BatchFailed", "BatchReport", "BatchState", "Pipeline"]

log = logging.getLogger("reclock.pipeline")


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
        self.settings = settings or Settings()
        self.maintenance = maintenance or Maintenance()
        self._batches_since_maintenance = 0
        self._now = now
        self._on_step = on_step or (lambda step: None)
        self._on_start: Callable[[BatchReport], None] = lambda report: None
        self._fence = fence or (lambda: None)
        declared = outputs_of(source)
        shaped, later = awaited_shapes(source, declared, shapes)
        self.outputs, self.routes = route_outputs(declared, shaped)
        self.layouts, awaited_layouts = layouts_of(source, self.outputs, layouts or {}, later)
        self.remap = RemapTable(self.lake.remap_path(name), self.lake.store)
        self.sinks = {o.name: make_sink(self.lake, name, o, self.layouts.get(o.name)) for o in self.outputs.values()}
        closed, awaited = awaited_windows(source, self.outputs, windows, later)
        self.windows = Windows(self.lake, name, closed, self.outputs, on_commit=self._on_step)
        self._driver = Driver(
            name,
            self.lake,
            source,
            self.data_plane,
            self.settings,
            self.remap,
            self.outputs,
            self.routes,
            self.layouts,
            self.sinks,
            self.windows,
            Awaited(later, awaited_layouts, awaited),
            Landings(self.lake.store, self.lake.landing_path(name)),
            now=now,
            fence=self._fence,
            on_step=self._on_step,
        )
        self.minter = Minter(self._driver)
        self._loop = BatchLoop(self._driver, self._step)
        born_outputs(self._driver)

    # -- progress ------------------------------------------------------------------------------

    @property
    def health(self) -> Health:
        """``starting`` until :meth:`run`; then what the loop last found (:mod:`reclock.runtime.health`)."""
        return self._loop.health

    @property
    def last_error(self) -> str | None:
        """The error behind a ``stalled``, ``degraded`` or ``failed`` health, in one line."""
        return self._loop.last_error

    @property
    def resume_upper(self) -> IntoTime:
        """The slowest output's upper: everything below it is durable in every output."""
        return self._driver.resume_upper

    def resume_frontier(self) -> Frontier:
        """``R(resume_upper - 1)``: where the source resumes, and what it may commit upstream.

        Like :attr:`finished`, it depends on bindings the outputs hold only, so it reads the
        remap view without re-reading it: no lake I/O, so observers and the loop's own test ask
        it while the store is away without meeting a storage error outside the loop's handling.
        """
        return self._driver.resume_frontier()

    @property
    def finished(self) -> bool:
        """The source is closed and every output holds its closing binding (no lake I/O)."""
        return self._driver.finished

    @property
    def lag(self) -> int | None:
        """Offsets the last probe saw not yet in every output (``None`` before a probe): the one
        definition of lag (:mod:`reclock.timeline.lag`), which the metrics and ``reclock offsets`` share."""
        probe = self.minter.last_probe
        return None if probe is None else total_lag(self.resume_frontier(), probe)

    @property
    def pending(self) -> bool:
        """Some binding is durable but not yet in every output."""
        return self._driver.pending

    @property
    def windows_current(self) -> bool:
        """Every window the outputs' uppers close is in its table (see :mod:`reclock.runtime.windowing`)."""
        return self.windows.current(self._driver.uppers(), self.finished)

    def close_windows(self) -> int:
        """Emit every window whose end its output's upper has passed; how many had rows."""
        return self.windows.close(self._driver.uppers(), self.finished)

    # -- steps ---------------------------------------------------------------------------------

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
            self.windows.close_after_batch(self._driver.uppers(), self.finished)
            self._batches_since_maintenance += 1
            if self.maintenance.every and self._batches_since_maintenance >= self.maintenance.every:
                report.maintenance = self._scheduled_maintenance()
        return report

    def _run_batch(self) -> BatchReport:
        """Steps 3 to 6: the batch a value through plan, land, commit and resume."""
        batch = plan(self._driver)
        if batch is None:
            return BatchReport()
        self._on_start(batch.report)
        return resume(self._driver, commit(self._driver, land(self._driver, batch))).report

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

    def _landing_ahead(self) -> bool:
        """Files landed ahead are not in every output yet: referenced by no table, so a vacuum
        (``full``: it removes files no version references) would delete them."""
        if not isinstance(self.source, AsksFirst):
            return False
        return self._driver.landings.pending(self.resume_upper) is not None

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

        Failures and health are the loop's (:mod:`reclock.runtime.loop`, ``docs/operations.md``):
        transient faults stall and retry, a failed batch is retried, skipped or fails the pipeline,
        a definite error fails it at once. Observers hear of each batch (``on_batch``, also of
        failed attempts) and of a failure that has no batch (``on_health``) after health is
        updated. ``on_start`` hears of each batch once it is planned, before anything is read
        (state ``In Progress``), so a slow batch is visible while it runs.
        """
        self._on_start = on_start or (lambda report: None)
        health = (lambda: on_health(self)) if on_health is not None else None
        try:
            self._loop.run(stop or threading.Event(), on_batch, health)
        finally:
            self.source.close()

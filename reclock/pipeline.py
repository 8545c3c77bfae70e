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

A crash anywhere leaves durable bindings and some outputs ahead of others; the next step simply
starts again at step 1 with the same rule, which re-derives the same rows (determinism) and lets
labels skip what already landed (exactly once).
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from persist.lake import NAME_PATTERN, Lake, sink_id
from persist.remap import RemapTable
from persist.sink import DataFile, OutputSink, table_schema
from reclock.dataplane import BatchPlan, DataPlane, LocalDataPlane
from reclock.errors import ConfigError, DefiniteSourceError
from reclock.health import Health
from reclock.time import Frontier, IntoTime
from sources.base import ERRORS, ERRORS_SCHEMA, Output, Source

__all__ = ["BatchReport", "Pipeline", "Settings", "wall_clock_ms"]

log = logging.getLogger("reclock.pipeline")


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Settings:
    """Tuning knobs; the defaults suit a local demo."""

    batch_interval: float = 1.0  # seconds to wait when the source has nothing new
    max_batch: int = 1_000_000  # offsets per binding and per batch (backpressure)
    idle_interval: float = 10.0  # seconds between time-only bindings while idle
    max_retries: int = 3  # failed attempts of a batch before the pipeline fails
    retry_backoff: float = 1.0  # seconds, doubled per attempt
    file_rows: int = 1_000_000  # rows per parquet file a task writes

    def __post_init__(self) -> None:
        for name in ("batch_interval", "idle_interval", "retry_backoff"):
            if getattr(self, name) < 0:
                raise ConfigError(name, "must be >= 0")
        for name in ("max_batch", "file_rows"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be >= 1")
        if self.max_retries < 0:
            raise ConfigError("max_retries", "must be >= 0")


@dataclass
class BatchReport:
    """What one step did; ``binding_ts`` is ``None`` when there was nothing to do."""

    binding_ts: IntoTime | None = None
    rows: dict[str, int] = field(default_factory=dict)
    splits: int = 0
    lower: Frontier = field(default_factory=Frontier)
    upper: Frontier = field(default_factory=Frontier)

    @property
    def idle(self) -> bool:
        return self.binding_ts is None


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
        now: Callable[[], int] = wall_clock_ms,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        if not NAME_PATTERN.match(name):
            raise ConfigError("name", f"pipeline name {name!r} must be an identifier of at most 64 characters")
        self.name = name
        self.lake = lake if isinstance(lake, Lake) else Lake.at(lake)
        self.source = source
        self.data_plane = data_plane or LocalDataPlane()
        self.settings = settings or Settings()
        self.health = Health.STARTING
        self.last_error: str | None = None
        self._last_probe: Frontier | None = None
        self._now = now
        self._on_step = on_step or (lambda step: None)
        self.outputs = _outputs_of(source)
        self.remap = RemapTable(self.lake.remap_path(name))
        self.sinks = {
            output.name: OutputSink(
                self.lake.output_path(name, output.name), sink_id(name, output.name), table_schema(output.schema)
            )
            for output in self.outputs.values()
        }

    # -- progress ------------------------------------------------------------------------------

    @property
    def resume_upper(self) -> IntoTime:
        """The slowest output's upper: everything below it is durable in every output."""
        return min(sink.upper for sink in self.sinks.values())

    def resume_frontier(self) -> Frontier:
        """``R(resume_upper - 1)``: where the source resumes, and what it may commit upstream."""
        return self.remap.bindings.source_upper_at(self.resume_upper)

    @property
    def finished(self) -> bool:
        """The source is closed and every output holds its closing binding."""
        bindings = self.remap.bindings
        return bindings.is_closed and self.resume_upper >= bindings.upper

    # -- the batch loop ------------------------------------------------------------------------

    @property
    def lag(self) -> int | None:
        """Offsets the last probe saw that are not yet in every output (``None`` before a probe)."""
        if self._last_probe is None:
            return None
        resume = self.resume_frontier()
        return 0 if resume.is_closed else resume.count_to(resume.join(self._last_probe))

    @property
    def pending(self) -> bool:
        """Some binding is durable but not yet in every output."""
        return self.resume_upper < self.remap.bindings.upper

    def step(self) -> BatchReport:
        """Catch up pending bindings, or else run steps 1 to 6 of the module docstring once."""
        if not self.pending:
            self._probe_and_mint()
            self._on_step("minted")
        return self._run_batch()

    def run(self, stop: threading.Event | None = None, on_batch: Callable[[BatchReport], None] | None = None) -> None:
        """Step until finished or ``stop`` is set; the in-flight batch always completes first.

        Transient failures are retried ``max_retries`` times with doubling backoff (health
        ``stalled``); a definite source error or an exhausted retry budget fails the pipeline.
        """
        stop = stop or threading.Event()
        attempts = 0
        while not stop.is_set() and not self.finished:
            try:
                report = self.step()
            except DefiniteSourceError as exc:
                self._fail(exc)
                raise
            except Exception as exc:
                attempts += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if attempts > self.settings.max_retries:
                    self._fail(exc)
                    raise
                self.health = Health.STALLED
                log.warning("pipeline %s: batch failed (attempt %d), retrying: %s", self.name, attempts, exc)
                stop.wait(self.settings.retry_backoff * 2 ** (attempts - 1))
                continue
            attempts = 0
            self.health = Health.RUNNING
            self.last_error = None
            if on_batch is not None:
                on_batch(report)
            if report.idle and not self.finished:
                stop.wait(self.settings.batch_interval)
        self.health = Health.STOPPED

    # -- steps ---------------------------------------------------------------------------------

    def _probe_and_mint(self) -> None:
        # Step 1: probe.
        bindings = self.remap.bindings
        if bindings.is_closed:
            return
        bound = bindings.frontier
        end = self.source.end()
        if end is not None and end.less_equal(bound):
            proposal = Frontier.closed()
        else:
            probe = self.source.upper()
            self._last_probe = probe
            if not bound.less_equal(probe):
                raise DefiniteSourceError(
                    f"pipeline {self.name}: the source's upper {probe!r} went back below the bound frontier "
                    f"{bound!r}; was the source recreated?"
                )
            proposal = self.source.cap(bound, probe, self.settings.max_batch)
        # Step 2: mint.
        now = self._now()
        if proposal == bound and bindings.upper and now - (bindings.upper - 1) < self.settings.idle_interval * 1000:
            return
        self.remap.mint(max(now, bindings.upper), proposal)

    def _run_batch(self) -> BatchReport:
        # Step 3: plan from the slowest output.
        bindings = self.remap.bindings
        lo = self.resume_upper
        times = bindings.times()
        first = bisect_left(times, lo)
        if first == len(times):
            return BatchReport()
        lower = bindings.source_upper_at(lo)
        hi = times[first]
        for t in times[first + 1 :]:
            frontier = bindings.source_upper_at(t + 1)
            if frontier.is_closed or lower.count_to(frontier) > self.settings.max_batch:
                break
            hi = t
        upper = bindings.source_upper_at(hi + 1)
        if upper.is_closed:
            upper = bindings.source_upper_at(hi)
        moved = [p for p, o in upper.items() if o > lower.offset(p)]
        splits = self.source.splits(lower, upper) if moved else []
        plan = BatchPlan(
            source=self.source,
            stamper=bindings.stamper(after=lo - 1 if lo else None, partitions=moved),
            uppers={name: sink.upper for name, sink in self.sinks.items()},
            roots={name: str(sink.path) for name, sink in self.sinks.items()},
            schemas={name: table_schema(output.schema) for name, output in self.outputs.items()},
            file_rows=self.settings.file_rows,
        )
        # Step 4: write.
        files = self.data_plane.run(plan, splits)
        self._on_step("written")
        # Step 5: commit each output once.
        by_output: dict[str, list[DataFile]] = {name: [] for name in self.sinks}
        for f in files:
            by_output[f.output].append(f)
        for name, sink in self.sinks.items():
            if sink.upper <= hi:
                sink.commit(by_output[name], hi)
            self._on_step(f"committed:{name}")
        # Step 6: tell the source how far every output holds.
        self.source.commit(self.resume_frontier())
        self._on_step("resumed")
        rows = {name: sum(f.num_records for f in fs) for name, fs in by_output.items()}
        return BatchReport(binding_ts=hi, rows=rows, splits=len(splits), lower=lower, upper=upper)

    def _fail(self, exc: BaseException) -> None:
        self.health = Health.FAILED
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.error("pipeline %s failed: %s", self.name, self.last_error)


def _outputs_of(source: Source) -> dict[str, Output]:
    outputs: dict[str, Output] = {}
    for output in source.outputs():
        if not NAME_PATTERN.match(output.name) or output.name.startswith("_"):
            raise ConfigError("outputs", f"output name {output.name!r} must be an identifier not starting with '_'")
        if output.name in outputs:
            raise ConfigError("outputs", f"output {output.name!r} is declared twice")
        if output.envelope != "append":
            raise ConfigError("outputs", f"output {output.name!r}: envelope {output.envelope!r} is not supported yet")
        outputs[output.name] = output
    outputs[ERRORS] = Output(ERRORS, ERRORS_SCHEMA)
    return outputs

"""The batch loop: steps a pipeline until it is finished or stopped; retry, backoff, health, stop.

It owns nothing of a batch: a step (:meth:`~reclock.runtime.pipeline.Pipeline.step`) runs the
stages, and the loop decides what a failure means (see ``docs/operations.md``):

* transient (:class:`~reclock.errors.TransientError`: broker away, timeouts): health ``stalled``,
  retried with capped backoff for as long as it lasts; never skips data;
* a failed batch (bad data, a corrupt file): retried whole ``max_retries`` times, then the
  pipeline fails (``stop_on_error``) or records the failed ranges as skipped, durably
  (:mod:`reclock.runtime.skips`), and goes on without them (the rules: :mod:`reclock.runtime.failures`);
* another driver moved an output (:class:`~reclock.errors.FencedError`): re-read what is
  durable, re-plan;
* definite (:class:`~reclock.errors.DefiniteSourceError`), a lost lease, or a broken invariant:
  fails at once.

Health is updated before observers hear of a batch (``on_batch``, also for failed attempts) or of
a failure that has no batch (``on_health``), so they never show a stale one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from reclock.errors import DefiniteSourceError, FencedError, TransientError, describe
from reclock.persist.lease import LeaseLost
from reclock.runtime.driver import Driver
from reclock.runtime.failures import Verdict, decide
from reclock.runtime.health import Health, after_batch
from reclock.runtime.minting import Interrupted
from reclock.runtime.planes import keep_warm
from reclock.runtime.reports import BatchFailed, BatchReport
from reclock.runtime.skips import record_skips
from reclock.sources.base import ERRORS

__all__ = ["WARM_POLL_S", "BatchLoop"]

log = logging.getLogger("reclock.pipeline")

#: The longest a pipeline waits between batches without giving its data plane a chance to keep
#: its workers (Spark checks for idle ones every 10 s and stops them after a minute).
WARM_POLL_S = 10.0


class BatchLoop:
    """Runs ``step`` until the driver's source is finished and its windows current, or ``stop``."""

    def __init__(self, driver: Driver, step: Callable[[threading.Event], BatchReport]) -> None:
        self.driver = driver
        self._step = step
        self.health = Health.STARTING
        self.last_error: str | None = None
        #: The failed batch's bad-data attempts, and the stalls in a row (for the backoff).
        self._attempts = self._stalls = 0

    def run(
        self,
        stop: threading.Event,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_health: Callable[[], None] | None = None,
    ) -> None:
        """Step until done or stopped; the in-flight batch always completes first."""
        driver = self.driver
        self._attempts = self._stalls = 0

        def observe(report: BatchReport | None) -> None:
            try:
                if report is not None and on_batch is not None:
                    on_batch(report)
                if on_health is not None:
                    on_health()
            except TransientError as exc:  # an observer that cannot reach the lake ends no loop
                log.warning("pipeline %s: could not report its state: %s", driver.name, describe(exc))

        while not stop.is_set() and not self.done:
            try:
                report = self._step(stop)
            except Interrupted:
                break
            except BatchFailed as exc:
                self._failed_batch(exc, stop, observe)
                continue
            except (DefiniteSourceError, AssertionError, LeaseLost) as exc:
                self._fail(exc)
                observe(None)
                raise
            except Exception as exc:
                self._stalls += 1
                if isinstance(exc, FencedError):
                    log.warning("pipeline %s: %s; re-reading the remap table and outputs", driver.name, exc)
                    try:
                        driver.resync()
                    except TransientError as fault:  # the next commit meets the moved outputs again: re-read then
                        exc = fault
                elif not isinstance(exc, TransientError) and self._stalls > driver.settings.max_retries:
                    self._fail(exc)
                    observe(None)
                    raise
                self._mark_stalled(exc)
                observe(None)
                self._backoff(stop, self._stalls)
                continue
            self._attempts = self._stalls = 0
            now = (self.health, self.last_error)
            self.health, self.last_error = after_batch(
                driver.name, report, driver.sinks[ERRORS].path, driver.lake.store, now
            )
            observe(report)
            if report.idle and not driver.finished:
                self._rest(stop, driver.settings.batch_interval)
            else:
                keep_warm(driver.plane)  # batches small enough for the driver leave Spark idle too
        self.health = Health.STOPPED
        observe(None)

    def _failed_batch(
        self, exc: BatchFailed, stop: threading.Event, observe: Callable[[BatchReport | None], None]
    ) -> None:
        """A batch whose splits failed: fail (re-raised), skip its failed ranges, or retry it."""
        driver = self.driver
        holders = [name for name, sink in driver.sinks.items() if sink.upper > exc.binding_ts]
        decision = decide(exc.kinds, self._attempts, driver.settings, holders)
        if decision.verdict is Verdict.FAIL:
            self._fail(exc)
            observe(exc.report)
            raise exc
        if decision.verdict is Verdict.FAIL_HELD:
            # A crash between two outputs' commits, then the range turned unreadable: the rows
            # already landed, so recording the range as skipped would count them twice.
            self._fail(
                DefiniteSourceError(
                    f"batch {exc.report.binding_ts} cannot be skipped: output {decision.held_by!r} already "
                    f"holds it, and its source range can no longer be read to finish the others ({exc})"
                )
            )
            observe(exc.report)
            raise exc
        self._attempts = decision.attempts
        if decision.verdict is Verdict.SKIP:
            self._mark_stalled(exc)
            observe(exc.report)
            try:
                record_skips(driver, exc.report, self._attempts)
            except TransientError as fault:  # the lake refused the skip: retry the batch later
                self._stalls += 1
                self._mark_stalled(fault)
                observe(None)
                self._backoff(stop, self._stalls)
                return
            self._attempts = 0
            return
        self._stalls += 1
        self._mark_stalled(exc)
        observe(exc.report)
        self._backoff(stop, self._stalls)

    @property
    def done(self) -> bool:
        """The source is finished and every window its outputs close is in its table."""
        driver = self.driver
        return driver.finished and driver.windows.current(driver.uppers(), driver.finished)

    def _mark_stalled(self, exc: BaseException) -> None:
        self.health = Health.STALLED
        self.last_error = describe(exc)
        log.warning("pipeline %s: stalled, will retry: %s", self.driver.name, self.last_error)

    def _fail(self, exc: BaseException) -> None:
        self.health = Health.FAILED
        self.last_error = describe(exc)
        log.error("pipeline %s failed (state Error): %s", self.driver.name, self.last_error)

    def _rest(self, stop: threading.Event, seconds: float) -> None:
        """Wait ``seconds`` between batches (or until ``stop``), keeping the data plane's workers
        meanwhile (:func:`~reclock.runtime.planes.keep_warm`): a wait longer than Spark's idle
        minute would otherwise cost the next batch on Spark new Python workers."""
        end = time.monotonic() + seconds
        while True:
            keep_warm(self.driver.plane)
            left = end - time.monotonic()
            if left <= 0 or stop.wait(min(left, WARM_POLL_S)):
                return

    def _backoff(self, stop: threading.Event, stalls: int) -> None:
        settings = self.driver.settings
        stop.wait(min(settings.max_backoff, settings.retry_backoff * 2 ** (stalls - 1)))

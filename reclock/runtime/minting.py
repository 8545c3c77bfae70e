"""Minting: steps 1 and 2 of a batch, from the source's upper to a durable binding.

The probe asks the source how far it has data, caps that to ``max_batch`` (backpressure) and
refuses a source that went back below what is already bound (a recreated topic). A source whose
probe needs the runtime to act first (:class:`~reclock.sources.base.AsksFirst`) says what in the
:class:`~reclock.sources.base.Probe` it returns: land records readable only now
(:func:`~reclock.runtime.land.land_ahead`) or run work on the pipeline's tasks; the minter does it
and probes again with the :class:`~reclock.sources.base.Answer`, until the source reports its
upper. The mint makes binding ``(T, F)`` durable with ``T = max(now, remap upper)`` (or the time
``F`` was landed ahead at, :mod:`reclock.runtime.ahead`) by compare-and-append; an idle source
still advances time every ``idle_interval`` so quiet pipelines never hold back a consistent read,
and a bounded source whose end is bound gets a closing binding.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from reclock.errors import ContractError, DefiniteSourceError
from reclock.runtime.driver import Driver
from reclock.runtime.land import land_ahead
from reclock.runtime.planes import task_runner
from reclock.sources.base import Answer, AsksFirst, Probe
from reclock.timeline.frontier import Frontier, IntoTime, Partition, Reread, encode_partition

__all__ = ["Interrupted", "Minter"]


class Minter:
    """The one place a pipeline's bindings come from."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.name = driver.name
        self.source = driver.source
        self.remap = driver.remap
        self.settings = driver.settings
        self._now = driver.now
        self.last_probe: Frontier | None = None  # the source's upper as the last probe saw it
        self._probing: _Call | None = None
        #: ``(bound, source upper, probe)`` of the last check: frontiers are immutable values, so
        #: a source that answers with the very same upper (an idle files source) is not joined and
        #: checked again against an unchanged bound, which would cost a pass over every partition.
        self._checked: tuple[Frontier, Frontier, Frontier] | None = None

    def probe_and_mint(self, stop: threading.Event | None) -> dict[str, int]:
        """Steps 1 and 2: probe and cap the source's upper, then mint a binding if it is due.

        Nothing is minted while the source is idle and the last binding is younger than
        ``idle_interval``; a bounded source whose end is bound gets the closing binding. Returns
        the milliseconds each step took (``probe``, ``mint``), for the batch's report.
        """
        # Step 1: probe.
        clock = time.monotonic()
        bindings = self.remap.bindings
        if bindings.is_closed:
            return {}
        bound = bindings.frontier
        end = self.source.end()
        if end is not None and end.less_equal(bound):
            proposal = Frontier.closed()
        else:
            raw = self._upper(stop)
            if self._checked is not None and self._checked[0] is bound and self._checked[1] is raw:
                probe = self._checked[2]  # the same values as last time: already joined and checked
            else:
                probe = bound.join(raw) if self.source.forgets_partitions else raw
                rereads: dict[Partition, int] = {p: o for p, o in bound.items() if isinstance(p, Reread)}
                if rereads:  # bound once, to a fixed end, by set-offsets: no probe names them
                    probe = probe.join(Frontier(rereads))
                self._check(bound, probe)
                self._checked = (bound, raw, probe)
            self.last_probe = probe
            proposal = self.source.cap(bound, probe, self.settings.max_batch)
        # Step 2: mint.
        probed = time.monotonic()
        phases = {"probe": int((probed - clock) * 1000)}
        now = self._now()
        if proposal == bound and bindings.upper and now - (bindings.upper - 1) < self.settings.idle_interval * 1000:
            return phases
        self.remap.mint(self._time_for(proposal, max(now, bindings.upper)), proposal)
        return {**phases, "mint": int((time.monotonic() - probed) * 1000)}

    def _time_for(self, proposal: Frontier, due: IntoTime) -> IntoTime:
        """``due``, unless ``proposal`` was landed ahead at a reserved time, which nothing has been
        bound at or after since (:mod:`reclock.runtime.ahead`): then that time. A landing kept for
        another frontier than the one proposed is a source breaking its promise."""
        if not isinstance(self.source, AsksFirst):
            return due
        ahead = self.driver.landings.unbound(self.remap.bindings.upper)
        if ahead is None:
            return due
        if ahead.upper != proposal:
            raise ContractError(
                f"pipeline {self.name}: the source landed {ahead.upper!r} ahead at {ahead.into_ts} "
                f"and then proposed {proposal!r} for that binding"
            )
        return ahead.into_ts

    def _check(self, bound: Frontier, probe: Frontier) -> None:
        """A probe below what is already bound means the source was recreated: a definite error."""
        if not bound.less_equal(probe):
            behind = [(p, probe.offset(p), o) for p, o in bound.items() if probe.offset(p) < o]
            named = ", ".join(f"{encode_partition(p)} is at {now} below bound {o}" for p, now, o in behind[:3])
            more = f" (and {len(behind) - 3} more)" if len(behind) > 3 else ""
            raise DefiniteSourceError(
                f"pipeline {self.name}: the source went back below what is already bound: {named}{more}; "
                "was the source recreated (a topic deleted, a broker replaced)?"
            )

    def _upper(self, stop: threading.Event | None) -> Frontier:
        """The source's upper (:meth:`_probe`), given up as soon as ``stop`` is set (then :class:`Interrupted`).

        A probe may wait long for a source that does not answer (a Kafka probe waits up to
        ``read_timeout_s`` to bootstrap), and nothing is durable before the mint, so a stop need
        not wait for it. The probe runs on a helper thread; one that was given up keeps running
        and the next probe takes its answer instead of starting a second one beside it (the
        source's upper never goes back, so an earlier answer is still a valid probe).
        """
        if stop is None:
            return self._probe()
        if self._probing is None:
            self._probing = _Call(self._probe, f"reclock-probe-{self.name}")
        if not self._probing.wait(stop):
            raise Interrupted
        call, self._probing = self._probing, None
        return call.result()

    def _probe(self) -> Frontier:
        """The source's upper: ``upper()``, or the dialogue of an :class:`AsksFirst` source's
        probe, each request done before the next probe (the whole of it on one thread)."""
        if not isinstance(self.source, AsksFirst):
            return self.source.upper()
        probe = self.source.probe(None)
        while probe.upper is None:
            probe = self.source.probe(self._answer(probe))
        return probe.upper

    def _answer(self, probe: Probe) -> Answer:
        """Do what ``probe`` asks: land its records ahead, durably, or run its work on the tasks."""
        if probe.land_first is not None:
            return Answer(landed=land_ahead(self.driver, probe.land_first).read)
        assert probe.run_first is not None, "a probe without an upper asks for something"
        work = probe.run_first
        return Answer(ran=tuple(task_runner(self.driver.plane)(work.fn, work.items)))

    def probing_for(self) -> float | None:
        """Seconds the probe in flight has waited for the source (``None``: none in flight).

        Read by the job's watcher thread: a source that does not answer (a broker down, a
        blackholed address) makes a probe wait up to its own timeout, often 30 s, and the job
        says so long before that.
        """
        call = self._probing
        return None if call is None or call.done else time.monotonic() - call.started


class Interrupted(Exception):
    """A stop was asked for while the driver waited for the source; nothing was minted."""


class _Call:
    """``fn()`` on a daemon thread, whose caller can stop waiting for it."""

    def __init__(self, fn: Callable[[], Frontier], name: str) -> None:
        self._done = threading.Event()
        self.started = time.monotonic()
        self._value: Frontier | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn,), name=name, daemon=True).start()

    def _run(self, fn: Callable[[], Frontier]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # handed to the waiting thread by result()
            self._error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, stop: threading.Event) -> bool:
        """``True`` once the call returned; ``False`` as soon as ``stop`` is set before that."""
        while not self._done.wait(0.05):
            if stop.is_set():
                return False
        return True

    def result(self) -> Frontier:
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

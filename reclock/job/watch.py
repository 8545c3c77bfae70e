"""The job's watcher thread: a stop request, the deadline, the heartbeat, and a source that does
not answer.

The batch loop is busy in a batch, a backoff or a probe, so whatever must happen while it is busy
happens here, every 0.2 s: a ``--max-seconds`` passed, or a stop asked for (``reclock stop``'s
marker, looked for every ``poll_s`` only: each look is a request to the lake, and the batch in
flight completes before a stop anyway), sets the stop event; the status snapshot is re-stamped every
:data:`~reclock.job.status.HEARTBEAT_S`; and a probe that has waited :data:`SLOW_PROBE_S` for the
source is said at once (a warning and a ``stalled`` status), not when the source's own timeout
(30 s for a Kafka bootstrap) finally ends it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from reclock.job.status import HEARTBEAT_S

__all__ = ["SLOW_PROBE_S", "watch"]

log = logging.getLogger("reclock.job")

#: Seconds a probe may wait for its source before the job says the source does not answer.
SLOW_PROBE_S = 5.0


def watch(
    stop_requested: Callable[[], bool],
    stop: threading.Event,
    max_seconds: float | None,
    beat: Callable[[], None],
    probing_for: Callable[[], float | None],
    slow: Callable[[float], None],
    poll_s: float = 0.2,
) -> None:
    """Run until ``stop`` is set: see the module docstring. ``slow(seconds)`` is called once per
    probe that has waited :data:`SLOW_PROBE_S`; ``probing_for`` says how long the current one has."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    next_beat = time.monotonic() + HEARTBEAT_S
    next_poll = time.monotonic() + poll_s
    said = False
    while not stop.wait(0.2):
        now = time.monotonic()
        if now >= next_poll:
            next_poll = now + poll_s
            if _asked(stop_requested):
                stop.set()
        if deadline is not None and now > deadline:
            stop.set()
        waited = probing_for()
        if waited is None:
            said = False
        elif waited >= SLOW_PROBE_S and not said:
            said = True
            slow(waited)
        if time.monotonic() >= next_beat:
            beat()
            next_beat = time.monotonic() + HEARTBEAT_S


def _asked(stop_requested: Callable[[], bool]) -> bool:
    """Whether a stop was requested; a lake that cannot be asked now (a network blip) has not."""
    try:
        return stop_requested()
    except OSError as exc:
        log.info("could not look for a stop request: %s", exc)
        return False

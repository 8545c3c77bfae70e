"""Health of a running pipeline, ordered so that the worst status wins when several are reported.

``stalled`` is a transient fault (broker down, commit conflict): retried with backoff, shown with
the error and a hint, and never mistaken for progress. ``failed`` is definite: retrying cannot help.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Health"]


class Health(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    STALLED = "stalled"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        return list(Health).index(self)

    def worst(self, other: Health) -> Health:
        return self if self.rank >= other.rank else other

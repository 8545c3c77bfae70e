"""Health of a running pipeline, as the job reports it in ``status.json`` and ``reclock status``.

``stalled`` is a transient fault (broker down, commit conflict, a full disk): retried with
backoff, shown with the error and a hint, and never mistaken for progress. ``failed`` is definite:
retrying cannot help. A reader also derives ``dead`` (no job holds the lock) in
:func:`reclock.job.status.read_status`; the job itself never reports it.
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

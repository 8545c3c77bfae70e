"""Control of a stored pipeline from any process: its definition, its job lock, a stop request.

The job (:mod:`reclock.job.lifecycle`) and the commands that must not run beside it (``detach``,
``set-offsets``, ``redrive``, maintenance) share these, so whoever holds the pipeline's lease is
the only writer of its remap table and outputs; the remap compare-and-append and the sink labels
fence anyone else.
"""

from __future__ import annotations

import json
import time

from reclock.errors import ConfigError, ReclockError
from reclock.job.config import PipelineConfig, parse_config
from reclock.persist.lake import Lake
from reclock.persist.lease import Lease

__all__ = ["exclusive", "exclusive_after_stop", "load", "missing_lake", "request_stop"]


def load(lake: Lake, name: str) -> tuple[PipelineConfig, int]:
    path = lake.definition_path(name)
    if not lake.store.exists(path):
        if not lake.exists():
            raise missing_lake(lake)
        known = ", ".join(lake.pipelines()) or "none"
        raise ConfigError("name", f"no pipeline {name!r} in lake {lake.root} (known: {known})")
    stored = json.loads(lake.store.read_text(path))
    return parse_config(stored["definition"], file=str(path)), stored["created_at_ms"]


def missing_lake(lake: Lake) -> ConfigError:
    """The error of a command pointed at a lake that does not exist (a typo in ``--lake``)."""
    return ConfigError(
        "--lake",
        f"there is no lake at {lake.root}: check --lake and $RECLOCK_LAKE (reclock create makes a lake)",
    )


def request_stop(lake: Lake, name: str) -> None:
    """Ask a running job to stop after its in-flight batch."""
    lake.store.touch(lake.control_dir(name) / "stop")


def exclusive(lake: Lake, name: str, ttl_s: float | None = None) -> Lease:
    """Take the pipeline's lease in the lake (:mod:`reclock.persist.lease`), renewed in the
    background until released; ``ttl_s`` defaults to the definition's ``[lease] ttl_seconds``.

    Only one driver may run a pipeline, on any machine: another live holder is a one-line
    :class:`~reclock.persist.lease.LeaseHeld` refusal. The remap compare-and-append and the sink
    labels fence a holder that lost its lease anyway; the lease makes that an up-front refusal.
    """
    if ttl_s is None:
        ttl_s = load(lake, name)[0].lease_ttl_s
    lease = Lease.acquire(lake, name, ttl_s)
    lease.start_renewing()
    return lease


def exclusive_after_stop(lake: Lake, name: str, wait_s: float) -> Lease:
    """Ask a running job to stop and take the lock once it did (its in-flight batch completes).

    Refuses, naming the pipeline, when the job still runs after ``wait_s`` seconds.
    """
    request_stop(lake, name)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock = exclusive(lake, name)
        except ReclockError:
            if time.monotonic() >= deadline:
                raise ReclockError(f"pipeline {name!r} did not stop within {wait_s:g} s") from None
            time.sleep(0.2)
            continue
        lake.store.delete(lake.control_dir(name) / "stop")
        return lock

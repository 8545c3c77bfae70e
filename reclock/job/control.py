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
from reclock.persist.lease import Lease, read_lease
from reclock.persist.store import LakePath

__all__ = [
    "clear_stale_stop",
    "exclusive",
    "exclusive_after_stop",
    "load",
    "missing_lake",
    "request_stop",
    "stop_asked",
]


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
    """Ask the running job to stop after its in-flight batch.

    The marker names the job it is for by its lease's token. A job clears the markers of others
    when it starts (one left by a job that ended before it read it), but it has the lease, and so
    counts as running for ``reclock stop``, seconds before that (its source and data plane start
    first): a marker without a name, cleared then, lost a stop asked of a starting job, which ran
    on. A job keeps a marker with its own token, and stops at its first look.
    """
    lease = read_lease(lake, name)
    lake.store.write_text(_stop_marker(lake, name), "" if lease is None else lease.holder.token)


def stop_asked(lake: Lake, name: str, token: str) -> bool:
    """Whether a stop is asked of the job whose lease has ``token``: one look for the marker (a
    ``stat``, or a HEAD on an object store), and a read only when there is one."""
    marker = _stop_marker(lake, name)
    if not lake.store.exists(marker):
        return False
    try:
        return lake.store.read_text(marker) == token
    except FileNotFoundError:  # removed between the two looks
        return False


def clear_stale_stop(lake: Lake, name: str, token: str) -> None:
    """Remove a stop marker asked of another job than the one whose lease has ``token``."""
    marker = _stop_marker(lake, name)
    try:
        stale = lake.store.read_text(marker) != token
    except FileNotFoundError:
        return
    if stale:
        lake.store.delete(marker)


def _stop_marker(lake: Lake, name: str) -> LakePath:
    return lake.control_dir(name) / "stop"


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
        lake.store.delete(_stop_marker(lake, name))
        return lock

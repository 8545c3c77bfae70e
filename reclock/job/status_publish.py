"""The job's status snapshot, kept current: after each batch, and by a heartbeat in between.

What is written (:class:`~reclock.job.status.Status`) and how it is fenced
(:class:`~reclock.job.status.StatusWriter`) is :mod:`reclock.job.status`; this is *when*. Each
write is a request to the lake, so an idle step writes only when the snapshot says something new,
and the heartbeat only once the last write is :data:`~reclock.job.status.HEARTBEAT_S` old. Both
share one lock: the heartbeat re-stamps the snapshot a batch is filling in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from reclock.errors import ReclockError, describe
from reclock.job.status import HEARTBEAT_S, Status, StatusWriter
from reclock.runtime.pipeline import Pipeline
from reclock.sources.base import SourceBase
from reclock.timeline.frontier import Frontier, Partition, encode_partition, wall_clock_ms

__all__ = ["failed_start", "heartbeat", "publish", "say"]

log = logging.getLogger("reclock.job")

_status_lock = threading.Lock()


def heartbeat(writer: StatusWriter, status: Status) -> None:
    """Re-stamp the last snapshot as of now, once it is :data:`HEARTBEAT_S` old: the job is alive
    and can still write the lake (a snapshot published since says so already)."""
    with _status_lock:
        if wall_clock_ms() - status.updated_ms < HEARTBEAT_S * 1000:
            return
        try:
            status.updated_ms = wall_clock_ms()
            writer.write(status)
        except (OSError, ReclockError) as exc:  # a lost lease too: the pipeline's fence stops the job
            log.warning("pipeline %s: could not publish its status: %s", status.pipeline, exc)


def say(writer: StatusWriter, status: Status, **changes: Any) -> None:
    """Write ``status`` with ``changes`` now, whatever its age: what the job must say at once (a
    source that does not answer, a start that failed)."""
    with _status_lock:
        try:
            for key, value in changes.items():
                setattr(status, key, value)
            status.updated_ms = wall_clock_ms()
            writer.write(status)
        except (OSError, ReclockError) as exc:
            log.warning("pipeline %s: could not publish its status: %s", status.pipeline, exc)


@contextlib.contextmanager
def failed_start(writer: StatusWriter, name: str) -> Iterator[None]:
    """A start-up step that raises leaves ``failed`` with its error, not ``starting``: a job that
    exits while ``starting`` reads as ``dead`` ("killed?"), which hides a refusal the job knew
    (a source folder that is gone, a store that cannot be reached; issue 41, item 3)."""
    try:
        yield
    except Exception as exc:
        say(writer, Status(pipeline=name, health="failed", last_error=describe(exc), pid=os.getpid()))
        raise


def publish(
    writer: StatusWriter,
    pipeline: Pipeline,
    status: Status,
    names: dict[Partition, str],
    *,
    if_changed: bool = False,
) -> None:
    """Write the status snapshot; a lake that refuses it must not end the job (see StorageError),
    and a lost lease is the pipeline's fence's to act on (the snapshot is simply not written).

    ``names`` keeps each partition's encoded name for the job: a files frontier names every file
    ever loaded, and encoding them all again at every batch cost more than the batch's reads.
    ``if_changed``: write only if the snapshot says something new (an idle step would otherwise
    cost a PUT every ``batch_interval``; the heartbeat keeps its time fresh).

    The snapshot is observability: the next publish after the storage recovers repairs it, and
    readers never trust a stale ``running`` anyway (:func:`reclock.job.status.read_status`).
    """
    with _status_lock:
        try:
            said = _said(status)
            status.health = pipeline.health.value
            status.finished = pipeline.finished
            status.last_error = pipeline.last_error
            if status.resume_upper != pipeline.resume_upper or status.resume_frontier == "{}":
                # R(resume_upper - 1) is fixed by resume_upper: encode it only when it moved.
                status.resume_upper = pipeline.resume_upper
                status.resume_frontier = _frontier_json(pipeline.resume_frontier(), names)
            status.bindings = len(pipeline.remap.held_bindings)  # no re-read of the remap table here
            status.warnings = list(pipeline.source.warnings()) if isinstance(pipeline.source, SourceBase) else []
            if if_changed and status.updated_ms and _said(status) == said:
                return
            status.updated_ms = wall_clock_ms()
            writer.write(status)
        except (OSError, ReclockError) as exc:
            log.warning("pipeline %s: could not publish its status: %s", pipeline.name, exc)


def _said(status: Status) -> dict[str, Any]:
    """What a snapshot tells a reader, but for when it was written."""
    return {**asdict(status), "updated_ms": 0}


def _frontier_json(frontier: Frontier, names: dict[Partition, str]) -> str:
    """``frontier.to_json()``, encoding each partition once per job (see :func:`publish`)."""
    if frontier.is_closed:
        return frontier.to_json()
    encoded = []
    for p, o in frontier.items():
        name = names.get(p)
        if name is None:
            name = names[p] = encode_partition(p)
        encoded.append((name, o))
    return json.dumps({"offsets": dict(sorted(encoded))}, separators=(",", ":"))

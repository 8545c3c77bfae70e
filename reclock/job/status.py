"""The status snapshot a running job publishes after every batch, for ``reclock status``.

Written atomically (a temporary file renamed over it, or one PUT in an object store) so a reader
never sees half a snapshot, and only by the driver holding the pipeline's lease
(:class:`StatusWriter`): a driver that lost it writes nothing, not even its status.
A snapshot is a claim made in the past: a job killed by SIGKILL, the OOM killer or a power cut
leaves one that still says ``running``. So :func:`read_status` believes a live health only while
the job holding the pipeline's lease (:mod:`reclock.persist.lease`) runs: on the job's machine, while
its process exists; elsewhere, while the lease is unexpired. A reader on the job's machine sees a
killed job as ``dead`` at once, one on another machine once its lease expires. A live job
rewrites its snapshot at least every :data:`HEARTBEAT_S` seconds, batch or no batch; one older
than :data:`STALE_AFTER_S` means the job cannot write the lake (full, read-only), so the reader
reports ``stalled`` with that hint instead of the claim.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from reclock.errors import ReclockError
from reclock.masking import masked
from reclock.persist import conditional
from reclock.persist.lake import Lake
from reclock.persist.lease import Lease, read_lease
from reclock.timeline.frontier import wall_clock_ms

__all__ = ["DEAD", "Status", "StatusWriter", "job_alive", "read_status"]

#: The health ``read_status`` reports for a job that died without publishing a final status.
DEAD = "dead"

_LIVE = ("starting", "running", "degraded", "stalled")

#: Seconds between two status writes of a live job, even in a long batch or a long backoff.
HEARTBEAT_S = 5.0

#: A live job's snapshot older than this cannot be trusted: the job could not write it.
STALE_AFTER_S = 4 * HEARTBEAT_S


@dataclass
class Status:
    pipeline: str
    health: str
    finished: bool = False
    last_error: str | None = None
    batches: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    resume_upper: int = 0
    resume_frontier: str = "{}"
    bindings: int = 0
    pid: int | None = None
    metrics_port: int | None = None
    last_maintenance: dict | None = None  # when the job last maintained its tables, and what it did
    warnings: list[str] = field(default_factory=list)  # the source's, as of its last probe
    updated_ms: int = 0


class StatusWriter:
    """Writes one job's snapshot, fenced like its data: never once another driver holds the lease.

    Two fences, because a check alone leaves a window. Before each write the lease is checked
    (:meth:`Lease.check`: a driver that slept through its expiry renews first, and finds it
    lost). And the write is a conditional PUT on the version this job wrote last
    (:mod:`reclock.persist.conditional`), so a driver paused *between* its check and its write
    cannot overwrite the snapshot of the driver that took over, which writes its own as soon
    as it holds the lease. A compare that fails is a takeover unless a renewal of the lease
    says otherwise (then someone else wrote the snapshot: it is written over).

    Raises :class:`~reclock.persist.lease.LeaseLost` once the lease is lost, and the lake's own
    errors (:class:`~reclock.errors.StorageError`) when it cannot be written.
    """

    def __init__(self, lake: Lake, pipeline: str, lease: Lease) -> None:
        self.lake = lake
        self.path = lake.status_path(pipeline)
        self.lease = lease
        found = conditional.read(lake.store, self.path)
        self._tag = None if found is None else found[1]

    def write(self, status: Status) -> None:
        text = masked(json.dumps(asdict(status), indent=1))  # an error may quote a DSN or a key id
        self.lease.check()
        try:
            self._tag = conditional.put(self.lake.store, self.path, text, self._tag, durable=False)
        except conditional.Conflict:
            self.lease.renew()  # LeaseLost if another driver holds it: then nothing is written
            found = conditional.read(self.lake.store, self.path)
            tag = None if found is None else found[1]
            self._tag = conditional.put(self.lake.store, self.path, text, tag, durable=False)


def read_status(lake: Lake, pipeline: str, *, now_ms: int | None = None) -> dict[str, Any] | None:
    """The latest snapshot, with a live health only if its job still runs (see the module doc).

    Read in one request (:func:`~reclock.persist.conditional.read`): the job rewrites the file
    every batch, and a read that takes an object's size first and its bytes in a second request
    (pyarrow's S3 files) can get the first bytes of a longer version that replaced it meanwhile.
    """
    found = conditional.read(lake.store, lake.status_path(pipeline))
    if found is None:
        return None
    status = json.loads(found[0])
    if status.get("health") not in _LIVE:
        return status
    earlier = f"; last error: {status['last_error']}" if status.get("last_error") else ""
    age = ((time.time() * 1000 if now_ms is None else now_ms) - status.get("updated_ms", 0)) / 1000
    alive = job_alive(lake, pipeline)
    if not alive:
        status["last_error"] = (
            f"the job (pid {status.get('pid')}) ended without a final status while {status['health']}{earlier}; "
            "start it again to resume"
        )
        status["health"] = DEAD
        return status
    if age > STALE_AFTER_S:
        status["last_error"] = (
            f"the job (pid {status.get('pid')}) has not updated its status for {age:.0f} s: it cannot write the "
            f"lake (full disk? read-only?); see its log{earlier}"
        )
        status["health"] = "stalled"
    return status


def job_alive(lake: Lake, pipeline: str, *, now_ms: int | None = None) -> bool:
    """Whether the job holding the pipeline's lease runs (see ``LeaseRecord.running``); a lake that
    cannot be asked says no."""
    try:
        lease = read_lease(lake, pipeline)
    except (OSError, ReclockError):
        return False
    return lease is not None and lease.running(wall_clock_ms() if now_ms is None else now_ms)

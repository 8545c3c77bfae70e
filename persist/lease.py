"""The job lease: which driver owns a pipeline, kept in the lake, so it holds across machines.

One driver at a time runs a pipeline (its batches, its maintenance). The owner holds a *lease*:
the file ``<lake>/<pipeline>/control/lease.json`` naming the holder (host, pid, a random token)
and an expiry, written only by compare-and-swap (:mod:`reclock.persist.conditional`: the store's
conditional PUT on S3, a guarded replace on a local disk). The rules:

* **take**: a driver may write its own lease over none, over a released one, over one whose
  expiry has passed by its clock, or over one whose holder is a process of this machine that no
  longer exists (a crash here frees the pipeline at once, as the kernel lock it replaces did).
  Otherwise it is refused with :class:`LeaseHeld`, which says who holds it until when;
* **renew**: the holder rewrites the lease with a later expiry every ``ttl / 3``, comparing
  against the version it wrote last; a failed compare means another driver took over: the
  lease is *lost* and the holder must stop (:meth:`Lease.check` raises :class:`LeaseLost`);
* **release**: at the end the holder marks it released, again by compare, so the next driver
  starts at once.

Clocks only decide *when* a takeover may happen, never whether data stays exact: a driver that
lost its lease and has not noticed yet (paused, its clock behind) is fenced by the remap
compare-and-append and the output labels, which refuse any commit planned on a view another driver
has moved (see ``docs/design/20261123_a_lease_in_the_lake.md``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from reclock.errors import ReclockError, TransientError
from reclock.persist import conditional
from reclock.persist.lake import Lake
from reclock.timeline.frontier import wall_clock_ms

__all__ = ["DEFAULT_TTL_S", "Holder", "Lease", "LeaseHeld", "LeaseLost", "LeaseRecord", "read_lease"]

log = logging.getLogger("reclock.lease")

#: Seconds a lease lasts without renewal: how long a pipeline whose driver vanished stays blocked.
DEFAULT_TTL_S = 30.0


class LeaseHeld(ReclockError):
    """Another live driver holds the pipeline's lease: this one may not run it now."""


class LeaseLost(ReclockError):
    """Another driver took over the lease this driver held: it must stop before it writes more."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough to tell the operator, and to tell a dead local process."""

    host: str
    pid: int
    token: str
    boot: str = ""  # this boot of the machine: a pid names a process only within one boot
    started: int = 0  # the process's start time in clock ticks since boot: a reused pid differs

    @classmethod
    def this_process(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), secrets.token_hex(16), _boot_id(), _started(os.getpid()))

    def alive_here(self) -> bool | None:
        """Whether the holder runs: ``None`` unless it is a process of this machine, this boot."""
        if self.host != socket.gethostname() or self.boot != _boot_id():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return not self.started or _started(self.pid) in (0, self.started)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


@dataclass(frozen=True)
class LeaseRecord:
    """One version of the lease file. ``expires_ms`` is wall-clock time on the holder's clock."""

    pipeline: str
    holder: Holder
    expires_ms: int
    ttl_ms: int
    released: bool = False

    def live(self, now_ms: int) -> bool:
        """Held, so another driver may not take it: not released, not expired, holder not known dead."""
        return not self.released and now_ms < self.expires_ms and self.holder.alive_here() is not False

    def running(self, now_ms: int) -> bool:
        """Whether its holder still runs, as far as this machine can tell: a holder here is judged by
        its process (alive, though it may not renew: a read-only lake, a pause), one elsewhere by
        the expiry."""
        if self.released:
            return False
        here = self.holder.alive_here()
        return now_ms < self.expires_ms if here is None else here

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeaseRecord:
        raw = json.loads(text)
        return cls(**{**raw, "holder": Holder(**raw["holder"])})


def read_lease(lake: Lake, pipeline: str) -> LeaseRecord | None:
    """The pipeline's lease as the lake holds it now, or ``None`` if no driver ever took one."""
    found = conditional.read(lake.store, lake.lease_path(pipeline))
    return None if found is None else LeaseRecord.from_json(found[0])


class Lease:
    """This driver's lease on one pipeline: taken by :meth:`acquire`, renewed in the background."""

    def __init__(self, lake: Lake, pipeline: str, record: LeaseRecord, tag: str, taken_at: float) -> None:
        self.lake = lake
        self.pipeline = pipeline
        self.record = record
        self._tag = tag
        self._renewed_at = taken_at  # monotonic time the last successful write was *sent*
        self._lost: str | None = None
        self._write = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._path = lake.lease_path(pipeline)

    @property
    def ttl_s(self) -> float:
        return self.record.ttl_ms / 1000

    @property
    def lost(self) -> bool:
        return self._lost is not None

    @classmethod
    def acquire(
        cls, lake: Lake, pipeline: str, ttl_s: float = DEFAULT_TTL_S, *, now: Callable[[], int] = wall_clock_ms
    ) -> Lease:
        """Take the lease or raise :class:`LeaseHeld` naming its live holder (see the module doc)."""
        path = lake.lease_path(pipeline)
        holder = Holder.this_process()
        ttl_ms = max(1, round(ttl_s * 1000))
        found = conditional.read(lake.store, path)
        if found is not None:
            current = LeaseRecord.from_json(found[0])
            if current.live(now()):
                raise LeaseHeld(_held_message(pipeline, current))
        sent = time.monotonic()
        record = LeaseRecord(pipeline, holder, now() + ttl_ms, ttl_ms)
        try:
            tag = conditional.put(lake.store, path, record.to_json(), None if found is None else found[1])
        except conditional.Conflict:
            # Another driver took it between our read and our write: it is live by definition.
            again = read_lease(lake, pipeline)
            why = _held_message(pipeline, again) if again else f"pipeline {pipeline!r}: another driver is starting it"
            raise LeaseHeld(why) from None
        log.info("pipeline %s: lease taken by %s until %s", pipeline, holder.describe(), _clock(record.expires_ms))
        return cls(lake, pipeline, record, tag, sent)

    def renew(self, *, now: Callable[[], int] = wall_clock_ms) -> None:
        """Extend the lease by one ttl from now; :class:`LeaseLost` if another driver holds it.

        A store that cannot be reached raises :class:`~reclock.errors.StorageError` (the lease
        may still be ours: the next renewal or :meth:`check` tells).
        """
        with self._write:
            while True:
                if self._lost is not None:
                    raise LeaseLost(self._lost)
                sent = time.monotonic()
                record = replace(self.record, expires_ms=now() + self.record.ttl_ms)
                try:
                    self._tag = conditional.put(self.lake.store, self._path, record.to_json(), self._tag)
                except conditional.Conflict:
                    self._adopt_or_lose()
                    continue
                self.record = record
                self._renewed_at = sent
                return

    def _adopt_or_lose(self) -> None:
        """After a failed compare: our own write whose answer we missed, or a takeover."""
        found = conditional.read(self.lake.store, self._path)
        current = None if found is None else LeaseRecord.from_json(found[0])
        ours = current is not None and current.holder.token == self.record.holder.token and not current.released
        if found is not None and ours:
            self._tag = found[1]
            return
        by = f"by {current.holder.describe()}" if current is not None else "(the lease file is gone)"
        self._lost = (
            f"pipeline {self.pipeline!r}: this driver ({self.record.holder.describe()}) lost its lease: it was taken "
            f"over {by} after it expired; this driver stops without writing more"
        )
        log.error("%s", self._lost)

    def check(self) -> None:
        """Called before every durable write of the job: raise :class:`LeaseLost` if we may not.

        Cheap while the renewer keeps up; when the last successful renewal was sent more than
        two thirds of a ttl ago (the process was paused, the store slow), renew here first, so a
        driver that slept through its expiry finds out before it writes, not after.
        """
        if self._lost is not None:
            raise LeaseLost(self._lost)
        if time.monotonic() - self._renewed_at >= self.ttl_s * 2 / 3:
            try:
                self.renew()
            except TransientError as exc:
                if time.monotonic() - self._renewed_at >= self.ttl_s:
                    raise TransientError(f"cannot renew the lease of pipeline {self.pipeline!r}: {exc}") from exc

    def start_renewing(self) -> None:
        """Renew every ``ttl / 3`` in a daemon thread until :meth:`release`."""
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.pipeline}", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3) and self._lost is None:
            try:
                self.renew()
            except LeaseLost:
                return
            except Exception as exc:  # the store is away: keep trying; check() stops writes if it lasts
                log.warning("pipeline %s: could not renew its lease: %s", self.pipeline, exc)

    def release(self) -> None:
        """Stop renewing and mark the lease released (only if it is still ours)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.ttl_s)
        with self._write:
            if self._lost is not None:
                return
            released = replace(self.record, expires_ms=wall_clock_ms(), released=True)
            with contextlib.suppress(ReclockError, OSError):  # taken meanwhile, or the store is away: it expires
                conditional.put(self.lake.store, self._path, released.to_json(), self._tag)


def _held_message(pipeline: str, record: LeaseRecord) -> str:
    holder = record.holder
    return (
        f"pipeline {pipeline!r} is already running (pid {holder.pid}) on {holder.host}, its lease live until "
        f"{_clock(record.expires_ms)}; stop it first (reclock stop), or retry once its lease expires"
    )


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ms / 1000))


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> int:
    """The process's start time in clock ticks since boot (Linux), 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0

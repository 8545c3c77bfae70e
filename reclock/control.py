"""Control of a stored pipeline from any process: its definition, its job lock, a stop request.

The job (:mod:`reclock.job`) and the commands that must not run beside it (``detach``,
``set-offsets``, maintenance) share these, so whoever holds the lock is the only writer of the
pipeline's remap table and outputs on this machine; the remap compare-and-append and the sink
labels fence anyone else.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import TextIO

from reclock.config import PipelineConfig, parse_config
from reclock.errors import ConfigError, ReclockError
from reclock.persist.lake import Lake

__all__ = ["exclusive", "exclusive_after_stop", "load", "request_stop"]


def load(lake: Lake, name: str) -> tuple[PipelineConfig, int]:
    path = lake.definition_path(name)
    if not lake.store.exists(path):
        known = ", ".join(lake.pipelines()) or "none"
        raise ConfigError("name", f"no pipeline {name!r} in lake {lake.root} (known: {known})")
    stored = json.loads(lake.store.read_text(path))
    return parse_config(stored["definition"], file=str(path)), stored["created_at_ms"]


def request_stop(lake: Lake, name: str) -> None:
    """Ask a running job to stop after its in-flight batch."""
    lake.store.touch(lake.control_dir(name) / "stop")


def exclusive(lake: Lake, name: str) -> TextIO:
    """Hold the pipeline's job lock for this process's lifetime (the OS drops it if we die).

    Only one driver may run a pipeline; the sinks fence a second one anyway (on any machine), but
    refusing it up front on the same machine gives a clear message instead of a stalled job. The
    lock is held on a read-only descriptor (``flock`` does not need write access) and the holder's
    pid written through another, short-lived one, so a running job keeps no lake file open for
    writing between its writes: an operator can remount the lake read-only, and the job stalls.
    """
    path = lake.job_lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    handle = open(path)  # noqa: SIM115 - held open on purpose until the job ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ReclockError(f"pipeline {name!r} is already running ({holder}); stop it first") from None
    path.write_text(f"pid {os.getpid()}")
    return handle


def exclusive_after_stop(lake: Lake, name: str, wait_s: float) -> TextIO:
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

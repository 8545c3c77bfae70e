"""The job's start-up: its data plane, and the lake steps it retries while the store is away.

A job starts by reading its status, clearing a stop request and opening its tables, all under a
lease it has just taken: a store that refuses then is as transient as during a batch (issue 21,
item 8), so each step is retried with the batch's backoff instead of ending the job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from reclock.errors import TransientError, describe
from reclock.job.config import PipelineConfig
from reclock.runtime.planes import DataPlane, LocalDataPlane, StartingSparkDataPlane
from reclock.runtime.settings import Settings
from reclock.sources.base import Source

__all__ = ["data_plane", "starting"]

log = logging.getLogger("reclock.job")

_T = TypeVar("_T")


def starting(stop: threading.Event, settings: Settings, what: str, step: Callable[[], _T]) -> _T:
    """One step of the job's start-up that reads or writes the lake, retried while the store is
    away, as a batch is: a storage error is transient wherever the job meets it (issue 21, item 8),
    also while it opens its tables under a lease it has just taken (renewed meanwhile). Anything
    else (a lost lease, a table that contradicts the definition) ends the start as before, and so
    does a stop asked for while the store is away."""
    stalls = 0
    while True:
        try:
            return step()
        except TransientError as exc:
            if stop.is_set():
                raise
            stalls += 1
            log.warning("stalled, will retry %s: %s", what, describe(exc))
            stop.wait(min(settings.max_backoff, settings.retry_backoff * 2 ** (stalls - 1)))


def data_plane(config: PipelineConfig, source: Source) -> DataPlane:
    """The configured plane; on a cluster, executors get reclock and the source's package shipped."""
    if config.engine == "local":
        return LocalDataPlane()
    from reclock.job.spark import shipped_packages, spark_session

    ship = shipped_packages(source)

    def start() -> Any:
        return spark_session(config.spark_master, config.spark_conf, ship=ship, ui=config.spark_ui)

    plane = StartingSparkDataPlane(
        start,
        small_batch_offsets=config.small_batch_offsets,
        timeout_s=config.spark_start_timeout_s,
        master=config.spark_master,
        warn=config.spark_background_start,
    )
    if not config.spark_background_start:
        plane.wait()
    return plane

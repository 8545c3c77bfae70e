"""A pipeline's tuning and maintenance knobs, apart from the driver so that reading a definition loads no runtime.

``reclock.job.config`` validates a TOML file into these; parsing must not import the batch loop,
Delta or Spark (a ``reclock create`` or a config check stays light).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reclock.errors import ConfigError

__all__ = ["Maintenance", "Settings"]


@dataclass(frozen=True)
class Settings:
    """Tuning knobs; the defaults suit a local demo."""

    batch_interval: float = 1.0  # seconds to wait when the source has nothing new
    max_batch: int = 1_000_000  # offsets per binding and per batch (backpressure)
    idle_interval: float = 10.0  # seconds between time-only bindings while idle
    max_retries: int = 3  # failed attempts of a batch before the pipeline fails
    retry_backoff: float = 1.0  # seconds, doubled per attempt
    max_backoff: float = 30.0  # seconds: the longest wait between attempts while stalled
    stop_on_error: bool = True  # after max_retries: stop (True) or skip what failed, recorded (False)
    file_rows: int = 1_000_000  # rows per parquet file a task writes

    def __post_init__(self) -> None:
        for name in ("batch_interval", "idle_interval", "retry_backoff", "max_backoff"):
            if not 0 <= getattr(self, name) < math.inf:  # NaN fails too: it would never wait, or wait forever
                raise ConfigError(name, f"must be a finite number >= 0, got {getattr(self, name)!r}")
        for name in ("max_batch", "file_rows"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "must be >= 1")
        if self.max_retries < 0:
            raise ConfigError("max_retries", "must be >= 0")


@dataclass(frozen=True)
class Maintenance:
    """When maintenance runs and what it keeps; the ``[maintenance]`` section of a definition."""

    every: int = 500  # batches between the job's own maintenance runs; 0: never (run it by hand)
    history_minutes: int = 0  # how far back upsert outputs' as-of reads and time travel stay exact
    target_file_mb: int = 128  # the size optimize compacts an output's files to

    def __post_init__(self) -> None:
        for name in ("every", "history_minutes"):
            if getattr(self, name) < 0:
                raise ConfigError(name, "must be a whole number >= 0")
        if self.target_file_mb < 1:
            raise ConfigError("target_file_mb", "must be >= 1")

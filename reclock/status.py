"""The status snapshot a running job publishes after every batch, for ``reclock status``.

Written atomically (write a temporary file, then rename) so a reader never sees half a snapshot.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from persist.lake import Lake

__all__ = ["Status", "read_status", "write_status"]


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
    updated_ms: int = 0


def write_status(lake: Lake, status: Status) -> None:
    path = lake.status_path(status.pipeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".status-")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(status), f, indent=1)
    os.replace(tmp, path)


def read_status(lake: Lake, pipeline: str) -> dict[str, Any] | None:
    try:
        return json.loads(lake.status_path(pipeline).read_text())
    except FileNotFoundError:
        return None

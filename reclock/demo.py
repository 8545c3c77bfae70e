"""The embedded default behind ``reclock demo``: a whole pipeline with nothing to install by hand.

It runs the generator's auction workload (persons, auctions, bids) into ``<lake>/demo`` and
returns the into time of a consistent cut to read, so the command can show every output as of one
moment on the shared timeline.
"""

from __future__ import annotations

import shutil
from typing import TextIO

from persist.asof import readable_upper
from persist.lake import Lake
from reclock import job
from reclock.config import parse_config
from reclock.health import Health
from reclock.time import IntoTime

__all__ = ["run_demo"]


def run_demo(lake: Lake, *, events: int, rate: float, engine: str, out: TextIO) -> IntoTime | None:
    """Run the demo pipeline to its end; the into time to read as of, or ``None`` if it failed."""
    shutil.rmtree(lake.pipeline_dir("demo"), ignore_errors=True)
    config = parse_config(
        {
            "pipeline": {
                "name": "demo",
                "lake": str(lake.root),
                "engine": engine,
                "batch_interval": 0.5,
                "max_batch": 100_000,
            },
            "source": {"kind": "generator", "partitions": 4, "rate": rate, "limit": events},
        }
    )
    job.create(config)
    out.write(f"demo: {events:,} auction events at {rate:,.0f}/s -> persons, auctions, bids in {lake.root}/demo\n")
    pipeline = job.run(lake, "demo", progress=out)
    if pipeline.health is Health.FAILED:
        return None
    return min(readable_upper(lake, "demo"), pipeline.remap.bindings.upper) - 1  # the closing binding

"""The resume stage: step 6 of a batch, the source told how far every output holds.

Once every output committed the batch, the resume frontier ``R(min_e upper_e - 1)`` goes to the
source's :meth:`~reclock.sources.base.Source.commit` (advisory: a Kafka source commits it to its
consumer group, the Postgres source confirms its slot), never further than what every output
holds durably. A landing ahead every output now holds is of no more use and goes
(:mod:`reclock.runtime.ahead`). The batch's report is complete here.
"""

from __future__ import annotations

from reclock.runtime.batch import Batch
from reclock.runtime.driver import Driver
from reclock.runtime.reports import ms_since
from reclock.timeline.frontier import wall_clock_ms

__all__ = ["resume"]


def resume(driver: Driver, batch: Batch) -> Batch:
    """Tell the source the resume frontier; the batch with its report's rows, phases and duration."""
    driver.source.commit(driver.resume_frontier())
    driver.on_step("resumed")
    driver.landings.drop_held(driver.resume_upper)
    report = batch.report
    report.phases["commit"], _ = ms_since(batch.clock)
    report.rows = {name: sum(f.num_records for f in fs) for name, fs in batch.files.items()}
    report.duration_ms = wall_clock_ms() - report.started_ms
    return batch

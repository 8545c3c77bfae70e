"""The commit stage: step 5 of a batch, each output's files in one Delta commit labelled with its id.

Every output commits once per batch, labelled ``binding_ts`` (the sink's
:class:`~deltalake.Transaction`), even with no file: its upper moves to ``binding_ts + 1``. An
output whose upper is past ``binding_ts`` holds the batch already (a crash between two outputs'
commits, then a replay) and is skipped, so each output holds each batch exactly once. The
batch's filtered counts ride on every commit (:data:`~reclock.runtime.reports.FILTERED`), so a
batch's status row can be rebuilt from any output after a crash.
"""

from __future__ import annotations

from reclock.runtime.batch import Batch
from reclock.runtime.driver import Driver
from reclock.runtime.reports import FILTERED, filtered_json

__all__ = ["commit"]


def commit(driver: Driver, batch: Batch) -> Batch:
    """Commit ``batch.files`` to every output that does not hold the batch yet, in the pipeline's
    output order; ``on_step("committed:<output>")`` after each (held or committed)."""
    metadata = {FILTERED: filtered_json(list(batch.results))}
    for name, sink in driver.sinks.items():
        if sink.upper <= batch.binding_ts:
            driver.fence()
            sink.commit(
                list(batch.files[name]),
                batch.binding_ts,
                planned_upper=batch.plan.uppers[name],
                metadata=metadata,
                append=name in batch.plan.appends,
            )
        driver.on_step(f"committed:{name}")
    return batch

"""Lag: how many offsets the source has that are not yet in every output, one definition for all.

Per partition, ``max(0, upper(p) - loaded(p))``, where ``upper`` is how far the source has data
(a probe) and ``loaded`` is how far every output holds it (``R(resume_upper - 1)``, the resume
frontier); the pipeline's lag is the sum over partitions. A finished pipeline (a closed loaded
frontier) lags by nothing; a source whose end is bound reports no open upper, and no lag.

The progress line of ``reclock start``, the ``reclock_lag_offsets`` and
``reclock_partition_lag_offsets`` metrics and the ``lag`` column of ``reclock offsets`` are this
function of these two frontiers. They can still differ by *when* each looked: the job's probe is
at most a batch old, ``reclock offsets`` probes the source when it runs (see
``docs/design/20261125_terminal_truth.md``).
"""

from __future__ import annotations

from reclock.timeline.frontier import Frontier, Partition

__all__ = ["partition_lags", "total_lag"]


def partition_lags(loaded: Frontier, upper: Frontier) -> dict[Partition, int]:
    """Each partition of ``upper`` with its lag (0 where every output holds it all)."""
    if upper.is_closed:
        return {}
    if loaded.is_closed:
        return dict.fromkeys(upper.partitions(), 0)
    return {p: max(0, o - loaded.offset(p)) for p, o in upper.items()}


def total_lag(loaded: Frontier, upper: Frontier) -> int:
    """The sum of :func:`partition_lags`: the offsets the outputs are behind the source."""
    return sum(partition_lags(loaded, upper).values())

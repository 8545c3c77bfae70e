"""Where tasks run: in the driver's threads, in Spark tasks, or in the driver until Spark is up.

A data plane takes a batch's plan and its splits and returns one
:class:`~reclock.runtime.task.SplitResult` per split; what a task does is
:mod:`reclock.runtime.task`, the same for every plane, so the choice of plane changes where the
work runs and how long it takes, never which rows land. Spark gets the splits packed into about
two tasks a core, largest first, so tasks finish close together.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from reclock.runtime.task import BatchPlan, SplitResult, run_splits
from reclock.sources.base import GroupReads, Split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


__all__ = ["AutoDataPlane", "DataPlane", "LocalDataPlane", "SparkDataPlane", "StartingSparkDataPlane"]


class DataPlane(Protocol):
    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]: ...


class LocalDataPlane:
    """Runs every split in the driver process: no per-job cost.

    A source whose group reads may run concurrently (:class:`GroupReads` with ``parallel_reads``,
    as the Kafka source's) is read by ``threads`` threads, each a task of its own (splits packed
    as for Spark): parsing, JSON decoding and parquet writing release the GIL, so two cores decode
    two partitions at once. Other sources are read split after split, as their authors wrote them.
    """

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads if threads is not None else min(4, os.cpu_count() or 1)

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        if self.threads < 2 or len(splits) < 2 or not _parallel(plan):
            return run_splits(plan, list(splits))
        groups = _pack(splits, self.threads)
        with ThreadPoolExecutor(len(groups), thread_name_prefix="reclock-task") as pool:
            return [r for results in pool.map(functools.partial(run_splits, plan), groups) for r in results]


class SparkDataPlane:
    """Splits run as Spark tasks; the driver only collects file metadata.

    Splits are packed into at most ``tasks_per_core`` x the default parallelism tasks, balanced by
    size: every task wave costs 60-150 ms here, so forty one-file tasks on two cores (twenty waves)
    lost to the in-driver plane, while a few tasks per core still balance uneven splits.
    """

    def __init__(self, spark: SparkSession, *, tasks_per_core: int = 2) -> None:
        self.spark = spark
        self.tasks_per_core = tasks_per_core

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        if not splits:
            return []
        context = self.spark.sparkContext
        groups = _pack(splits, max(1, context.defaultParallelism * self.tasks_per_core))
        rdd = context.parallelize(groups, len(groups))
        return rdd.flatMap(functools.partial(_run_group, plan)).collect()


def _parallel(plan: BatchPlan) -> bool:
    return isinstance(plan.source, GroupReads) and plan.source.parallel_reads


def _pack(splits: Sequence[Split], bins: int) -> list[list[Split]]:
    """Largest split first into the least loaded task (LPT), so tasks finish close together."""
    loads = [0] * min(bins, len(splits))
    groups: list[list[Split]] = [[] for _ in loads]
    for split in sorted(splits, key=lambda s: s.end - s.start, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(split)
        loads[i] += split.end - split.start
    return groups


def _run_group(plan: BatchPlan, group: list[Split]) -> list[SplitResult]:
    return run_splits(plan, group)


class AutoDataPlane:
    """Spark for real batches, the driver for small ones.

    A Spark job costs a fixed 0.1-0.5 s here whatever its size, which dominates a small batch:
    measured (``benchmarks/scenarios/freshness.py``), a 1,000-row Kafka batch takes 1.09 s on Spark
    against 0.67 s in the driver, and Spark only pays from about 20,000 rows. Both planes run the
    same task function, so the choice changes only where the work runs, never its result.
    """

    def __init__(self, spark: DataPlane, local: DataPlane | None = None, *, small_batch_offsets: int = 20_000) -> None:
        self.spark = spark
        self.local = local or LocalDataPlane()
        self.small_batch_offsets = small_batch_offsets

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        size = sum(split.end - split.start for split in splits)
        plane = self.local if size < self.small_batch_offsets else self.spark
        return plane.run(plan, splits)


class StartingSparkDataPlane:
    """A Spark data plane whose session starts in the background; until it is up, batches run in
    the driver.

    Starting a session costs seconds (a JVM, then the first jobs warm up), and a restarted job
    used to pay all of it before its first commit. Both planes run the same task function, so a
    batch lands the same rows wherever it runs; only where the work happens changes. A session
    that fails to start fails the batches that need it, naming why.
    """

    def __init__(
        self, start: Callable[[], SparkSession], local: DataPlane | None = None, *, small_batch_offsets: int = 0
    ) -> None:
        self.local = local or LocalDataPlane()
        self.small_batch_offsets = small_batch_offsets
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reclock-spark-start")
        self._session = self._pool.submit(start)
        self._plane: DataPlane | None = None

    def wait(self) -> None:
        """Wait for the session (``[spark] background_start = false``): every batch on Spark."""
        self._session.result()

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        if self._plane is None:
            if not self._session.done():
                return self.local.run(plan, splits)
            spark = SparkDataPlane(self._session.result())
            self._plane = (
                AutoDataPlane(spark, self.local, small_batch_offsets=self.small_batch_offsets)
                if self.small_batch_offsets
                else spark
            )
            self._pool.shutdown(wait=False)
        return self._plane.run(plan, splits)

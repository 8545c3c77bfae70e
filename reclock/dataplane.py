"""The data plane: read splits, stamp, shape and write parquet files, in Spark tasks or in-driver.

Both planes run the same task function, :func:`run_split`, so the in-driver plane (tiny batches,
tests without a JVM) and the Spark plane (real work, a cluster) cannot drift apart. A task:

1. reads its split from the source (replayable, so a retried task sees the same records);
2. stamps every row with ``_into_ts`` from the batch's :class:`~reclock.stamp.Stamper`;
3. drops rows stamped below their output's upper: those are already durable (a resumed batch
   re-reads from the slowest output's frontier, faster outputs must not get them twice);
4. shapes the rows to the output table's schema and writes parquet files into its folder;
5. returns a :class:`SplitResult`: the files' metadata and row counts, or the error that stopped
   it. Nothing is visible until the driver commits.

A task never raises for a failing split: it reports the error, so the driver sees *which* splits
failed and can retry the batch, stop, or skip exactly those ranges (and record them). A row no
binding covers is a broken invariant (the source read outside its split): an assertion, reported
the same way but never skipped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import ContractError, ErrorKind, classify, describe
from reclock.persist.sink import DELETED, DataFile, discard_data_file, write_data_file
from reclock.persist.store import LOCAL, Store
from reclock.sources.base import ERRORS, Source, Split, error_batch
from reclock.stamp import UNBOUND, Stamper
from reclock.time import INTO_TS, OFFSET, PARTITION, IntoTime, encode_partition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["AutoDataPlane", "BatchPlan", "DataPlane", "LocalDataPlane", "SparkDataPlane", "SplitResult", "run_split"]


@dataclass(frozen=True)
class BatchPlan:
    """Everything a task needs; pickled into every Spark task, so keep it small."""

    source: Source
    stamper: Stamper
    uppers: Mapping[str, IntoTime]
    roots: Mapping[str, str]
    schemas: Mapping[str, pa.Schema]
    file_rows: int = 1_000_000
    #: Per output that is not ``append``: its envelope and key columns (see :mod:`sources.base`).
    envelopes: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    #: The lake's store: tasks write their files straight into it (a folder or an object store).
    store: Store = LOCAL


@dataclass(frozen=True)
class SplitResult:
    """What one task did: the files it wrote, or why it failed (then ``files`` is empty)."""

    split: Split
    files: list[DataFile] = field(default_factory=list)
    rows: int = 0
    bytes_read: int = 0
    earliest: int | None = None  # least source offset read
    latest: int | None = None  # greatest source offset read
    started_ms: int = 0
    duration_ms: int = 0
    error: str | None = None
    error_kind: ErrorKind | None = None

    @property
    def partition(self) -> str:
        return encode_partition(self.split.partition)


class DataPlane(Protocol):
    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]: ...


class LocalDataPlane:
    """Runs every split in the driver process: no per-job cost, no parallelism."""

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        return [run_split(plan, split) for split in splits]


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
    return [run_split(plan, split) for split in group]


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


def run_split(plan: BatchPlan, split: Split) -> SplitResult:
    """Read, stamp, filter, shape and write one split (see the module docstring)."""
    started = time.time()
    stats = {"rows": 0, "bytes_read": 0, "earliest": None, "latest": None}
    files: list[DataFile] = []
    try:
        _run_split(plan, split, files, stats)
    except Exception as exc:
        for f in files:
            discard_data_file(plan.roots[f.output], f, plan.store)
        return SplitResult(
            split,
            started_ms=int(started * 1000),
            duration_ms=int((time.time() - started) * 1000),
            error=describe(exc),
            error_kind=classify(exc),
        )
    return SplitResult(
        split, files, started_ms=int(started * 1000), duration_ms=int((time.time() - started) * 1000), **stats
    )


def _run_split(plan: BatchPlan, split: Split, files: list[DataFile], stats: dict) -> None:
    partition = encode_partition(split.partition)
    pending: dict[str, list[pa.Table]] = {}
    counts: dict[str, int] = {}
    for output, batch in plan.source.read(split):
        stats["bytes_read"] += batch.nbytes
        if batch.num_rows:
            offsets = batch.column(OFFSET)
            lo, hi = pc.min(offsets).as_py(), pc.max(offsets).as_py()
            stats["earliest"] = lo if stats["earliest"] is None else min(stats["earliest"], lo)
            stats["latest"] = hi if stats["latest"] is None else max(stats["latest"], hi)
        schema = plan.schemas.get(output)
        if schema is None:
            raise ContractError(f"source yielded rows for unknown output {output!r} from split {split!r}")
        into = plan.stamper.into_times(batch.column(PARTITION), batch.column(OFFSET), partition=partition)
        if len(into) and (into == UNBOUND).any():
            raise ContractError(f"split {split!r} yielded a record no binding covers: reads must stay in their split")
        keep = into >= plan.uppers[output]
        if not keep.any():
            continue
        envelope, key = plan.envelopes.get(output, ("append", ()))
        shaped = output_rows(_unwrap(batch, envelope, key), into, schema)
        if not keep.all():
            shaped = shaped.filter(pa.array(keep))
        if key:
            shaped, orphans = _split_null_keys(shaped, key, plan.schemas[ERRORS])
            orphans = orphans.filter(pc.greater_equal(orphans.column(INTO_TS), plan.uppers[ERRORS]))
            if orphans.num_rows:
                pending.setdefault(ERRORS, []).append(orphans)
                counts[ERRORS] = counts.get(ERRORS, 0) + orphans.num_rows
        pending.setdefault(output, []).append(shaped)
        counts[output] = counts.get(output, 0) + shaped.num_rows
        stats["rows"] += shaped.num_rows
        if counts[output] >= plan.file_rows:
            files.append(_flush(plan, output, pending, counts))
    files.extend(_flush(plan, output, pending, counts) for output in list(pending))


def _flush(plan: BatchPlan, output: str, pending: dict[str, list[pa.Table]], counts: dict[str, int]) -> DataFile:
    table = pa.concat_tables(pending.pop(output))
    counts.pop(output)
    return write_data_file(plan.roots[output], output, table, plan.store)


def _unwrap(batch: pa.RecordBatch, envelope: str, key: tuple[str, ...]) -> pa.RecordBatch:
    """Give upsert and debezium batches the row columns plus ``_deleted``; append passes through."""
    if envelope == "append":
        return batch
    if envelope == "debezium":
        deleted = pc.fill_null(pc.equal(batch.column("op"), "d"), False)
        before, after = batch.column("before"), batch.column("after")
        names = [f.name for f in after.type]
        columns = [
            pc.if_else(deleted, pc.struct_field(before, [i]), pc.struct_field(after, [i])) for i in range(len(names))
        ]
        others = [n for n in batch.schema.names if n not in (PARTITION, OFFSET, "before", "after", "op")]
        return pa.RecordBatch.from_arrays(
            [
                batch.column(PARTITION),
                batch.column(OFFSET),
                *columns,
                *(batch.column(n) for n in others),
                deleted,
            ],
            names=[PARTITION, OFFSET, *names, *others, DELETED],
        )
    if batch.schema.get_field_index(DELETED) >= 0:
        return batch
    values = [n for n in batch.schema.names if n not in (PARTITION, OFFSET, *key)]
    deleted = pa.array(np.ones(batch.num_rows, dtype=bool))
    for name in values:
        deleted = pc.and_(deleted, pc.is_null(batch.column(name)))
    return batch.append_column(DELETED, deleted)


def _split_null_keys(table: pa.Table, key: tuple[str, ...], errors: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """Rows without a key cannot be upserted: they become ``_errors`` rows, never silently lost."""
    missing = pc.is_null(table.column(key[0]))
    for name in key[1:]:
        missing = pc.or_(missing, pc.is_null(table.column(name)))
    if not pc.any(missing).as_py():
        return table, errors.empty_table()
    bad = table.filter(missing)
    n = bad.num_rows
    reasons = error_batch(
        bad.column(PARTITION).combine_chunks(),
        bad.column(OFFSET).combine_chunks(),
        ["null_key"] * n,
        [f"upsert key {list(key)} is null"] * n,
        [None] * n,
    )
    orphans = output_rows(reasons, bad.column(INTO_TS).combine_chunks(), errors)
    return table.filter(pc.invert(missing)), orphans


def output_rows(batch: pa.RecordBatch, into: np.ndarray | pa.Array, schema: pa.Schema) -> pa.Table:
    """A reader's batch as rows of its output table: stamped with ``_into_ts``, in the table's
    column order and types. A batch missing a column of its output is a broken source."""
    columns = []
    for target in schema:
        if target.name == INTO_TS:
            columns.append(pa.array(into, pa.int64()))
            continue
        index = batch.schema.get_field_index(target.name)
        if index < 0:
            raise ContractError(f"source batch lacks column {target.name!r} of its output")
        column = batch.column(index)
        columns.append(column if column.type == target.type else column.cast(target.type))
    return pa.Table.from_arrays(columns, schema=schema)

"""The data plane: read splits, stamp, shape and write parquet files, in Spark tasks or in-driver.

Both planes run the same task function, :func:`run_split`, so the in-driver plane (tiny batches,
tests without a JVM) and the Spark plane (real work, a cluster) cannot drift apart. A task:

1. reads its split from the source (replayable, so a retried task sees the same records);
2. stamps every row with ``_into_ts`` from the batch's :class:`~reclock.stamp.Stamper`;
3. drops rows stamped below their output's upper: those are already durable (a resumed batch
   re-reads from the slowest output's frontier, faster outputs must not get them twice);
4. shapes the rows to the output table's schema and writes parquet files into its folder;
5. returns the files' metadata. Nothing is visible until the driver commits.

A row no binding covers is a broken invariant (the source read outside its split): the task fails
instead of guessing a time.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from persist.sink import INTO_TS, DataFile, write_data_file
from reclock.stamp import UNBOUND, Stamper
from reclock.time import IntoTime
from sources.base import Source, Split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchPlan", "DataPlane", "LocalDataPlane", "SparkDataPlane", "run_split"]


@dataclass(frozen=True)
class BatchPlan:
    """Everything a task needs; pickled into every Spark task, so keep it small."""

    source: Source
    stamper: Stamper
    uppers: Mapping[str, IntoTime]
    roots: Mapping[str, str]
    schemas: Mapping[str, pa.Schema]
    file_rows: int = 1_000_000


class DataPlane(Protocol):
    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[DataFile]: ...


class LocalDataPlane:
    """Runs every split in the driver process: no per-job cost, no parallelism."""

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[DataFile]:
        return [f for split in splits for f in run_split(plan, split)]


class SparkDataPlane:
    """One Spark task per split; the driver only collects file metadata."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[DataFile]:
        if not splits:
            return []
        rdd = self.spark.sparkContext.parallelize(list(splits), len(splits))
        return rdd.flatMap(functools.partial(run_split, plan)).collect()


def run_split(plan: BatchPlan, split: Split) -> list[DataFile]:
    """Read, stamp, filter, shape and write one split (see the module docstring)."""
    pending: dict[str, list[pa.Table]] = {}
    counts: dict[str, int] = {}
    files: list[DataFile] = []
    for output, batch in plan.source.read(split):
        schema = plan.schemas.get(output)
        if schema is None:
            raise ValueError(f"source yielded rows for unknown output {output!r} from split {split!r}")
        into = plan.stamper.into_times(batch.column("_partition"), batch.column("_offset"))
        if len(into) and (into == UNBOUND).any():
            raise AssertionError(f"split {split!r} yielded a record no binding covers: reads must stay in their split")
        keep = into >= plan.uppers[output]
        if not keep.any():
            continue
        shaped = _shape(batch, into, schema)
        if not keep.all():
            shaped = shaped.filter(pa.array(keep))
        pending.setdefault(output, []).append(shaped)
        counts[output] = counts.get(output, 0) + shaped.num_rows
        if counts[output] >= plan.file_rows:
            files.append(_flush(plan, output, pending, counts))
    files.extend(_flush(plan, output, pending, counts) for output in list(pending))
    return files


def _flush(plan: BatchPlan, output: str, pending: dict[str, list[pa.Table]], counts: dict[str, int]) -> DataFile:
    table = pa.concat_tables(pending.pop(output))
    counts.pop(output)
    return write_data_file(plan.roots[output], output, table)


def _shape(batch: pa.RecordBatch, into: np.ndarray, schema: pa.Schema) -> pa.Table:
    columns = []
    for field in schema:
        if field.name == INTO_TS:
            columns.append(pa.array(into, pa.int64()))
            continue
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            raise ValueError(f"source batch lacks column {field.name!r} of its output")
        column = batch.column(index)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)

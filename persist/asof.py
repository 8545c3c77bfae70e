"""As-of reads: every output of a pipeline exactly as of one into time.

Output ``e`` holds exactly the rows with ``_into_ts < upper_e`` (its commit label + 1), so a cut
at ``T`` is consistent across outputs, and across pipelines on the same timeline, as long as
``T < min_e upper_e``: that minimum is :func:`readable_upper`. For ``T`` below it we time-travel
each table to the first version whose label reached ``T`` (append outputs would be right on the
latest version too, but an upsert output rewrites rows, so time travel is the general answer) and
keep the rows with ``_into_ts <= T``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from persist.lake import Lake, sink_id
from persist.read import read_table
from reclock.time import IntoTime

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["output_upper", "read_as_of", "read_as_of_spark", "readable_upper"]


def output_upper(path: Path, app_id: str) -> IntoTime:
    version = DeltaTable(str(path)).transaction_version(app_id)
    return 0 if version is None else version + 1


def readable_upper(lake: str | Path | Lake, pipelines: str | list[str]) -> IntoTime:
    """First into time for which no consistent cut across all outputs of ``pipelines`` exists yet."""
    lake = lake if isinstance(lake, Lake) else Lake.at(lake)
    names = [pipelines] if isinstance(pipelines, str) else pipelines
    uppers = [
        output_upper(lake.output_path(name, output), sink_id(name, output))
        for name in names
        for output in lake.outputs(name)
    ]
    return min(uppers, default=0)


def read_as_of(lake: str | Path | Lake, pipeline: str, as_of: IntoTime) -> dict[str, pa.Table]:
    """Every output of ``pipeline`` (``_errors`` included) as of ``as_of``, as Arrow tables."""
    lake, versions = _plan(lake, pipeline, as_of)
    out = {}
    for output, version in versions.items():
        table = DeltaTable(str(lake.output_path(pipeline, output)), version=version)
        out[output] = read_table(table, filters=[("_into_ts", "<=", as_of)])
    return out


def read_as_of_spark(
    spark: SparkSession, lake: str | Path | Lake, pipeline: str, as_of: IntoTime
) -> dict[str, DataFrame]:
    """Like :func:`read_as_of`, as Spark DataFrames over the same files (no Delta jars needed)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    lake, versions = _plan(lake, pipeline, as_of)
    out = {}
    for output, version in versions.items():
        table = DeltaTable(str(lake.output_path(pipeline, output)), version=version)
        schema = pa.schema(table.schema().to_arrow())
        uris = table.file_uris()
        spark_schema = from_arrow_schema(schema)
        frame = spark.read.schema(spark_schema).parquet(*uris) if uris else spark.createDataFrame([], spark_schema)
        out[output] = frame.where(F.col("_into_ts") <= as_of)
    return out


def _plan(lake: str | Path | Lake, pipeline: str, as_of: IntoTime) -> tuple[Lake, dict[str, int]]:
    lake = lake if isinstance(lake, Lake) else Lake.at(lake)
    upper = readable_upper(lake, pipeline)
    if as_of >= upper:
        raise ValueError(f"pipeline {pipeline!r}: no consistent cut at {as_of} yet; readable upper is {upper}")
    versions = {}
    for output in lake.outputs(pipeline):
        path = lake.output_path(pipeline, output)
        versions[output] = _first_version_reaching(path, sink_id(pipeline, output), as_of)
    return lake, versions


def _first_version_reaching(path: Path, app_id: str, as_of: IntoTime) -> int:
    """Least table version whose label is ``>= as_of``: labels only grow with versions."""
    lo, hi = 0, DeltaTable(str(path)).version()
    while lo < hi:
        mid = (lo + hi) // 2
        label = DeltaTable(str(path), version=mid).transaction_version(app_id)
        if label is not None and label >= as_of:
            hi = mid
        else:
            lo = mid + 1
    return lo

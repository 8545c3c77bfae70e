"""Baseline (c): Spark Structured Streaming's file source, writing parquet with its own checkpoint.

What a Spark user writes to ingest a directory of files exactly once without reclock: a streaming
read of the directory with a declared schema, a parquet sink (whose ``_spark_metadata`` log makes
its output exactly once), a checkpoint, and ``trigger(availableNow=True)`` to take everything
there now and stop. Same session, same files, same schema as reclock's run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["run"]


def run(spark: SparkSession, source_dir: Path, fmt: str, ddl: str, output: Path, checkpoint: Path) -> None:
    """Ingest every ``fmt`` ("csv" with a header, or "parquet") file of ``source_dir`` into ``output``."""
    reader = spark.readStream.schema(ddl)
    stream = reader.option("header", True).csv(str(source_dir)) if fmt == "csv" else reader.parquet(str(source_dir))
    query = (
        stream.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(output))
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"structured streaming query failed: {query.exception()}")

"""Parquet files of a lake in an object store, read by Spark tasks through the lake's own store.

Spark reads S3 through Hadoop's ``s3a`` connector, whose jars a session cannot always download
(these machines cannot). The files of an as-of cut are known on the driver (the Delta snapshot
names them), so Spark needs no file system of its own: a DataFrame of file URIs is spread over the
tasks, and each task reads its files with pyarrow through the lake's :class:`~reclock.persist.store.Store`
(a picklable value holding the storage options), yielding Arrow batches (``mapInArrow``). The
rows never pass through the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from reclock.persist.store import Store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_parquet_files"]


def read_parquet_files(spark: SparkSession, store: Store, uris: list[str], schema: pa.Schema) -> DataFrame:
    """A DataFrame of the rows of the parquet files ``uris`` (``s3://`` URIs of ``store``), as ``schema``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark_schema = from_arrow_schema(schema)
    if not uris:
        return spark.createDataFrame([], spark_schema)
    tasks = max(1, min(len(uris), spark.sparkContext.defaultParallelism))
    names = spark.createDataFrame([(uri,) for uri in uris], "uri string").repartition(tasks)
    return names.mapInArrow(_reader(store, schema), spark_schema)


def _reader(store: Store, schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """What each task runs: read the files its batch of URIs names, one at a time."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for uri in batch.column(0).to_pylist():
                yield from store.read_parquet([uri], schema=schema).to_batches()

    return read

"""A PySpark 4 ``DataSourceStreamReader``, unchanged, as a reclock source.

PySpark's streaming data source and reclock's source protocol ask the same questions in other
words: ``latestOffset`` is the probe (:meth:`Source.upper`), ``partitions(start, end)`` the cut
(:meth:`Source.splits`), ``read(partition)`` the task, ``commit(end)`` the advisory committer.
What differs is the offset: PySpark's is an opaque JSON-able dict, reclock's a
:class:`~reclock.timeline.frontier.Frontier` of partition -> first record offset *not* included, and reclock
needs every record's own ``(partition, offset)`` to stamp it. An :class:`OffsetCodec` is that
mapping, in both directions:

* :class:`PartitionedOffsets` (the default): the offset is a flat dict ``{key: int}``. Each key is
  one reclock partition; its int counts the key's records. A split of key ``k`` over ``[a, b)``
  asks the reader for ``partitions({k: a}, {k: b})`` (one key at a time, so that every record it
  yields belongs to ``k``), and its records get offsets ``a, a + 1, ...`` in read order.
* :class:`OrderedOffsets`: any other offset (nested, several fields) when the source is one
  ordered stream. The user gives ``position(offset) -> int`` and its inverse; the stream is one
  reclock partition.

Either way an offset range of ``n`` must hold exactly ``n`` records (offsets count records), and
any int between two offsets the reader returned must be a valid offset: reclock cuts ranges
anywhere (backpressure, resumption). A split that reads another number of records breaks that
assumption and fails with :class:`~reclock.errors.DefiniteSourceError` rather than stamping rows
at guessed coordinates. Readers whose offsets are not counts (a file list, a timestamp) need a
native reclock source.

``read`` must be replayable, as Spark's own micro-batch retries already require: the same range
yields the same rows in the same order. A row that does not fit the schema goes to ``_errors``
at its coordinates.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

from reclock.errors import ConfigError, DefiniteSourceError
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, Output, SourceBase, Split, clip_message, error_batch
from reclock.timeline.frontier import Frontier, Partition, encode_partition

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader

__all__ = ["OffsetCodec", "OrderedOffsets", "PartitionedOffsets", "StreamReaderSource", "arrow_schema"]

#: Rows per Arrow batch :meth:`StreamReaderSource.read` yields.
_FLUSH_ROWS = 50_000


class OffsetCodec(Protocol):
    """Maps a reader's opaque offsets to frontiers and back; must pickle (tasks use it)."""

    def to_frontier(self, offset: Mapping[str, Any]) -> Frontier:
        """The frontier an offset the reader returned stands for."""
        ...

    def to_offset(self, partition: Partition, position: int) -> dict[str, Any]:
        """The reader's offset for ``partition`` at ``position``, as ``partitions`` expects it."""
        ...


@dataclass(frozen=True)
class PartitionedOffsets:
    """Offsets of the shape ``{key: int}``: one reclock partition per key, its int a record count."""

    def to_frontier(self, offset: Mapping[str, Any]) -> Frontier:
        bad = [k for k, v in offset.items() if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise DefiniteSourceError(
                f"stream reader offset {dict(offset)!r} is not {{key: int}} (key {bad[0]!r}); "
                "give StreamReaderSource an OrderedOffsets codec for offsets of another shape"
            )
        return Frontier({key: count for key, count in offset.items()})

    def to_offset(self, partition: Partition, position: int) -> dict[str, Any]:
        assert isinstance(partition, str), "to_frontier made every partition a key of the reader's offset"
        return {partition: position}


@dataclass(frozen=True)
class OrderedOffsets:
    """One ordered stream whose offsets are not ``{key: int}``: ``position`` gives the record count
    an offset stands for, ``offset_at`` the offset at a count. Both must be module-level functions
    (they travel to tasks) and inverse to each other."""

    position: Callable[[Mapping[str, Any]], int]
    offset_at: Callable[[int], dict[str, Any]]
    partition: str = "stream"

    def to_frontier(self, offset: Mapping[str, Any]) -> Frontier:
        return Frontier({self.partition: int(self.position(offset))})

    def to_offset(self, partition: Partition, position: int) -> dict[str, Any]:
        return self.offset_at(position)


class StreamReaderSource(SourceBase):
    """Runs ``data_source.streamReader(schema)`` as a reclock source with one output.

    ``data_source`` is a ``pyspark.sql.datasource.DataSource`` instance (its ``options`` set as
    Spark would set them), or, in a pipeline definition, its class as ``"package.module:Class"``
    with ``options`` (strings, as Spark passes them). Its ``schema()`` is the output's schema
    unless ``schema`` (Arrow, a ``StructType`` or DDL) is given. ``output`` names the output table
    (default: the data source's name). The reader object itself travels to tasks, as it does in
    Spark, so it must pickle.
    """

    def __init__(
        self,
        data_source: DataSource | str,
        *,
        options: Mapping[str, Any] | None = None,
        output: str | None = None,
        schema: pa.Schema | StructType | str | None = None,
        codec: OffsetCodec | None = None,
    ) -> None:
        if isinstance(data_source, str):
            data_source = _data_source(data_source, options or {})
        elif options is not None:
            raise ConfigError("options", "give options only with data_source as 'package.module:Class'")
        spark_schema = data_source.schema() if schema is None else schema
        self.schema = arrow_schema(spark_schema)
        self.output = output or re.sub(r"\W", "_", type(data_source).name())
        self.codec: OffsetCodec = codec or PartitionedOffsets()
        struct = spark_schema if isinstance(spark_schema, StructType) else from_arrow_schema(self.schema)
        self.reader: DataSourceStreamReader = data_source.streamReader(struct)
        self._latest: dict[str, Any] = self.reader.initialOffset()
        self.initial = self.codec.to_frontier(self._latest)

    # -- driver side ---------------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        return [Output(self.output, self.schema)]

    def upper(self) -> Frontier:
        """The probe: ``latestOffset`` from the last offset it returned, with no read limit
        (reclock's backpressure, ``max_batch``, cuts the range afterwards)."""
        latest = self.reader.latestOffset
        takes_start = len(inspect.signature(latest).parameters) >= 2
        # pyspark 4's latestOffset(start, limit); a reader written for 3.5 has latestOffset().
        self._latest = latest(self._latest, ReadAllAvailable()) if takes_start else latest()  # type: ignore[call-arg]
        return self.codec.to_frontier(self._latest)

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[Split]:
        """The default cut of ``[lower joined with initialOffset, upper)``: records before the
        reader's initial offset do not exist for it."""
        return super().splits(lower.join(self.initial), upper)

    def commit(self, frontier: Frontier) -> None:
        """``commit(end)`` with the resume frontier: every output holds everything below it."""
        if frontier.is_closed:
            return
        end: dict[str, Any] = {}
        for partition, position in frontier.items():
            end.update(self.codec.to_offset(partition, position))
        self.reader.commit(end)

    def close(self) -> None:
        self.reader.stop()

    # -- task side -------------------------------------------------------------------------------

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The reader's rows for ``[split.start, split.end)`` of one partition, at offsets
        ``start, start + 1, ...`` in read order; exactly ``end - start`` of them, or the split fails."""
        encoded = encode_partition(split.partition)
        start = self.codec.to_offset(split.partition, split.start)
        end = self.codec.to_offset(split.partition, split.end)
        offset = split.start
        pending: list[Any] = []
        for part in self.reader.partitions(start, end):
            for item in self.reader.read(part):
                if isinstance(item, pa.RecordBatch):  # Arrow in: kept columnar unless a column does not cast
                    yield from self._batches(encoded, offset, pending, split.end)
                    offset += len(pending)
                    pending = []
                    yield from self._columns(encoded, offset, item, split.end)
                    offset += item.num_rows
                    continue
                pending.append(item)
                if len(pending) >= _FLUSH_ROWS:
                    yield from self._batches(encoded, offset, pending, split.end)
                    offset += len(pending)
                    pending = []
        yield from self._batches(encoded, offset, pending, split.end)
        offset += len(pending)
        if offset != split.end:
            raise DefiniteSourceError(
                f"stream reader partition {split.partition!r}: offsets [{split.start}, {split.end}) read "
                f"{offset - split.start} records; reclock needs offsets that count records "
                "(see reclock.sources.pyspark_in)"
            )

    def _columns(
        self, encoded: str, first: int, batch: pa.RecordBatch, end: int
    ) -> Iterator[tuple[str, pa.RecordBatch]]:
        """A batch the reader yielded as Arrow: its columns cast to the schema, with lineage."""
        if not batch.num_rows:
            return
        self._check_within(encoded, first + batch.num_rows, end)
        try:
            arrays = [batch.column(field.name).cast(field.type) for field in self.schema]
            yield self.output, self._lineaged(encoded, list(range(first, first + batch.num_rows)), arrays)
            return
        except (pa.ArrowException, KeyError):
            pass
        # Row by row with the same casts, so that a row lands or fails whatever batch it came in.
        good: list[tuple[int, list[pa.Array]]] = []
        bad: list[tuple[int, str, str, bytes]] = []
        for i in range(batch.num_rows):
            row = batch.slice(i, 1)
            try:
                good.append((first + i, [row.column(field.name).cast(field.type) for field in self.schema]))
            except (pa.ArrowException, KeyError) as exc:
                message = clip_message(f"{type(exc).__name__}: {exc}")
                bad.append((first + i, "schema", message, repr(row.to_pylist()[0]).encode()))
        if good:
            columns = [pa.concat_arrays([arrays[c] for _, arrays in good]) for c in range(len(self.schema))]
            yield self.output, self._lineaged(encoded, [o for o, _ in good], columns)
        if bad:
            offsets, kinds, messages, raws = zip(*bad, strict=True)
            yield ERRORS, error_batch(encoded, offsets, kinds, messages, raws)

    def _lineaged(self, encoded: str, offsets: list[int], arrays: list[pa.Array]) -> pa.RecordBatch:
        lineage = [pa.array([encoded] * len(offsets), pa.string()), pa.array(offsets, pa.int64())]
        return pa.RecordBatch.from_arrays(lineage + arrays, schema=pa.schema([*LINEAGE_FIELDS, *self.schema]))

    def _check_within(self, encoded: str, past_last: int, end: int) -> None:
        if past_last > end:
            raise DefiniteSourceError(
                f"stream reader partition {encoded!r}: the range ending at {end} read more records than "
                "its offsets count; reclock needs offsets that count records (see reclock.sources.pyspark_in)"
            )

    def _batches(self, encoded: str, first: int, rows: list[Any], end: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        if not rows:
            return
        self._check_within(encoded, first + len(rows), end)
        offsets = list(range(first, first + len(rows)))
        try:
            yield self.output, self._batch(encoded, offsets, rows)
            return
        except (pa.ArrowException, TypeError, ValueError, KeyError, IndexError):
            pass
        good: list[tuple[int, Any]] = []
        bad: list[tuple[int, str, str, bytes]] = []
        for offset, row in zip(offsets, rows, strict=True):
            try:
                self._batch(encoded, [offset], [row])
                good.append((offset, row))
            except (pa.ArrowException, TypeError, ValueError, KeyError, IndexError) as exc:
                bad.append((offset, "schema", clip_message(f"{type(exc).__name__}: {exc}"), repr(row).encode()))
        if good:
            yield self.output, self._batch(encoded, [o for o, _ in good], [r for _, r in good])
        if bad:
            offsets_, kinds, messages, raws = zip(*bad, strict=True)
            yield ERRORS, error_batch(encoded, offsets_, kinds, messages, raws)

    def _batch(self, encoded: str, offsets: list[int], rows: list[Any]) -> pa.RecordBatch:
        """Rows (tuples, ``Row`` s or dicts) as one batch of the output's schema with lineage."""
        names = self.schema.names
        if isinstance(rows[0], Mapping):
            columns = [[row[name] for row in rows] for name in names]
        else:
            if any(len(row) != len(names) for row in rows):
                raise ValueError(f"a row does not have the schema's {len(names)} fields")
            columns = [list(values) for values in zip(*rows, strict=True)]
        return self._lineaged(
            encoded, offsets, [pa.array(values, field.type) for values, field in zip(columns, self.schema, strict=True)]
        )


def _data_source(target: str, options: Mapping[str, Any]) -> DataSource:
    """``package.module:Class`` instantiated with ``options`` as strings, as Spark would."""
    from pyspark.sql.datasource import DataSource

    module_name, _, name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), name) if name else None
    except (ImportError, AttributeError) as exc:
        raise ConfigError("data_source", f"cannot import {target!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, DataSource)):
        raise ConfigError(
            "data_source", f"must name a pyspark DataSource class as 'package.module:Class', got {target!r}"
        )
    return cls({key: str(value) for key, value in options.items()})


def arrow_schema(schema: pa.Schema | StructType | str) -> pa.Schema:
    """An Arrow schema from a data source's ``schema()``: Arrow, a ``StructType``, or a DDL string
    of top-level primitive columns (``"site string, celsius double"``)."""
    if isinstance(schema, pa.Schema):
        return schema
    if isinstance(schema, str):
        return pa.schema([_ddl_field(part) for part in schema.split(",") if part.strip()])
    return to_arrow_schema(schema)


_DDL_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "varchar": pa.string(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def _ddl_field(part: str) -> pa.Field:
    name, _, kind = part.strip().partition(" ")
    dtype = _DDL_TYPES.get(kind.strip().lower().removesuffix(" not null"))
    if dtype is None:
        raise ConfigError(
            "schema", f"cannot read the DDL column {part!r}; pass schema= as a StructType or an Arrow schema"
        )
    return pa.field(name.strip("`"), dtype, nullable="not null" not in kind.lower())

"""reclock's sources served to Spark as PySpark 4 Python data sources.

``register(spark)`` makes ``spark.read.format("reclock-kafka")`` (and ``reclock-files``,
``reclock-generator``) read through reclock's own readers, in Python tasks: a Kafka topic without
the JVM Kafka connector's jars. The mapping is the source protocol read the other way round:

* a batch read plans ``source.splits(start, upper)`` once, where ``upper`` is the source's end
  when it is bounded and its probe otherwise (Kafka: the high watermarks when the query is
  planned; the start is the source's own ``start`` option, earliest by default);
* a streaming read's offsets are frontiers as JSON (``{encoded partition: offset}``): the initial
  offset is the empty frontier (``startingOffsets = earliest``) or the probe when the query starts
  (``latest``), ``latestOffset`` the probe, capped by the read limit Spark passes (``ReadMaxRows``,
  which ``getDefaultReadLimit`` gives from ``maxRecordsPerTrigger``), ``partitions(start, end)``
  the splits, ``commit(end)`` the source's advisory commit; ``Trigger.AvailableNow`` reads up to
  the probe taken when the query starts;
* each Spark partition is one :class:`~reclock.sources.base.Split`; its task runs
  ``source.read(split)`` and keeps the batches of the chosen ``output`` (``_errors`` is an output
  too), with ``_partition`` and ``_offset``.

Rows are not stamped: ``_into_ts`` exists only in a pipeline's tables, which bind offsets to the
timeline durably. Spark options are strings; a value that parses as JSON is passed parsed
(numbers, lists, mappings), except topic names. ``maxRecordsPerTrigger`` and ``startingOffsets``
are the streaming read's own options, never the source's
(``docs/design/20261124_pyspark_streams_start_and_take_a_limit.md``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from reclock.envelope import DEBEZIUM
from reclock.errors import ConfigError
from reclock.job.plugins import source_class, source_options
from reclock.sources.base import ERRORS, ERRORS_SCHEMA, LINEAGE_FIELDS, Source, Split, debezium_schema
from reclock.timeline.frontier import Frontier, decode_partition, encode_partition

__all__ = ["FilesDataSource", "GeneratorDataSource", "KafkaDataSource", "register"]

#: Spark option names that stand for a source's constructor argument.
_ALIASES = {"bootstrap": "bootstrap_servers", "topic": "topics"}
#: Options whose value is a comma-separated list of names, never JSON.
_NAME_LISTS = frozenset({"topics"})
#: Options of a streaming read itself, by Spark's names (lowercase: options are case-insensitive).
_MAX_ROWS, _STARTING = "maxrecordspertrigger", "startingoffsets"
_STARTS = ("earliest", "latest")


def register(spark: SparkSession) -> None:
    """Register ``reclock-kafka``, ``reclock-files`` and ``reclock-generator`` with ``spark``."""
    for data_source in (KafkaDataSource, FilesDataSource, GeneratorDataSource):
        spark.dataSource.register(data_source)


class _ReclockDataSource(DataSource):
    """A built-in reclock source kind as a Spark data source; subclasses name the kind."""

    kind: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return f"reclock-{cls.kind}"

    def schema(self) -> StructType:
        return from_arrow_schema(_output_schema(self._source(), self._output()), prefer_timestamp_ntz=False)

    def reader(self, schema: StructType) -> DataSourceReader:
        for name in (_MAX_ROWS, _STARTING):
            if self._option(name) is not None:
                raise ConfigError(name, f"is an option of a streaming read; {self.name()} reads everything in a batch")
        return _BatchReader(self._source(), self._output(), to_arrow_schema(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        source = self._source()
        text = self._option(_MAX_ROWS)
        limit: ReadLimit = ReadAllAvailable()
        if text is not None:
            rows = int(text) if text.strip().isdigit() else 0
            if rows < 1:
                raise ConfigError(_MAX_ROWS, f"must be a whole number of rows >= 1, got {text!r}")
            limit = ReadMaxRows(rows)
        starting = (self._option(_STARTING) or self._default_start(source)).strip().lower()
        if starting not in _STARTS:
            raise ConfigError(_STARTING, f"must be earliest or latest, got {self._option(_STARTING)!r}")
        return _StreamReader(source, self._output(), to_arrow_schema(schema), limit=limit, latest=starting == "latest")

    def _default_start(self, source: Source) -> str:
        """Where a stream starts without ``startingOffsets``: at the source's beginning."""
        return "earliest"

    def _option(self, name: str) -> str | None:
        return next((str(v) for k, v in self.options.items() if k.lower() == name), None)

    def _output(self) -> str:
        names = [o.name for o in self._source().outputs()]
        chosen = self.options.get("output")
        if chosen is None:
            if len(names) != 1:
                raise ConfigError("output", f"{self.name()} has outputs {', '.join(names)}: choose one with output=")
            return names[0]
        if chosen not in [*names, ERRORS]:
            raise ConfigError("output", f"must be one of {', '.join([*names, ERRORS])}, got {chosen!r}")
        return chosen

    def _source(self) -> Source:
        """The source the options describe; a wrong option is a :class:`ConfigError` naming it."""
        cls = source_class(self.kind)
        params = source_options(cls).known
        arguments: dict[str, Any] = {}
        for key, text in self.options.items():
            name = _ALIASES.get(key.lower(), key.lower())
            if name in ("output", _MAX_ROWS, _STARTING) and name not in params:
                continue  # they choose the output, and how a stream reads; the source never sees them
            if name not in params:
                raise ConfigError(name, f"unknown option of {self.name()} (known: output, {', '.join(params)})")
            if name in _NAME_LISTS:
                arguments[name] = [part.strip() for part in text.split(",") if part.strip()]
                continue
            try:
                arguments[name] = json.loads(text)
            except ValueError:
                arguments[name] = text
        return cls(**arguments)


class KafkaDataSource(_ReclockDataSource):
    """``reclock-kafka``: options of :class:`~reclock.sources.kafka.KafkaSource` (``bootstrap``,
    ``topic`` / ``topics``, ``format``, ``metadata``, ``start``, ...)."""

    kind = "kafka"


class FilesDataSource(_ReclockDataSource):
    """``reclock-files``: options of :class:`~reclock.sources.files.FilesSource` (``path``, ...)."""

    kind = "files"


class GeneratorDataSource(_ReclockDataSource):
    """``reclock-generator``: options of :class:`~reclock.sources.generator.GeneratorSource`;
    a batch read needs ``limit``, and ``output`` (``persons``, ``auctions`` or ``bids``).

    An unbounded generator's records exist from ``anchor_ms`` on, the epoch unless given, so its
    stream starts at ``latest`` (now) by default: from the epoch, its first micro-batch would be
    some 10^11 records per partition at any rate. A bounded one starts at ``earliest``."""

    kind = "generator"

    def _default_start(self, source: Source) -> str:
        return "latest" if source.end() is None else "earliest"


class _BatchReader(DataSourceReader):
    """One plan at query time: the splits of ``[start, end or probe)``."""

    def __init__(self, source: Source, output: str, schema: pa.Schema) -> None:
        self.source, self.output, self.schema = source, output, schema

    def partitions(self) -> Sequence[InputPartition]:
        try:
            upper = self.source.end() or self.source.upper()
            return [InputPartition(split) for split in self.source.splits(Frontier(), upper)]
        finally:
            self.source.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.source, partition.value, self.output, self.schema)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between frontiers; offsets are frontiers as ``{encoded partition: offset}``.

    ``limit`` is the read limit of the options (``maxRecordsPerTrigger``): Spark asks for it with
    ``getDefaultReadLimit`` and passes it, or another, to ``latestOffset``, which must obey the
    one passed. ``latest`` starts a new query at the probe instead of the source's beginning.
    """

    def __init__(
        self, source: Source, output: str, schema: pa.Schema, *, limit: ReadLimit | None = None, latest: bool = False
    ) -> None:
        self.source, self.output, self.schema = source, output, schema
        self.limit = limit or ReadAllAvailable()
        self.latest = latest
        self._target: Frontier | None = None  # Trigger.AvailableNow: the probe when the query started

    def initialOffset(self) -> dict:
        """Where a new query starts (a restarted one starts at its checkpoint instead)."""
        return _offset(self.source.upper()) if self.latest else {}

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.limit

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read what exists now, in micro-batches of the read limit, then stop."""
        self._target = self.source.upper()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        lower = _frontier(start)
        upper = lower.join(self.source.upper() if self._target is None else self._target)
        if isinstance(limit, ReadMaxRows):
            upper = self.source.cap(lower, upper, limit.max_rows)
        return _offset(upper)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [InputPartition(split) for split in self.source.splits(_frontier(start), _frontier(end))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.source, partition.value, self.output, self.schema)

    def commit(self, end: dict) -> None:
        self.source.commit(_frontier(end))

    def stop(self) -> None:
        self.source.close()


def _read(source: Source, split: Split, output: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The batches of ``split`` for ``output``, in Spark's column order and types."""
    for name, batch in source.read(split):
        if name == output and batch.num_rows:
            columns = [batch.column(field.name).cast(field.type) for field in schema]
            yield pa.RecordBatch.from_arrays(columns, schema=schema)


def _output_schema(source: Source, output: str) -> pa.Schema:
    if output == ERRORS:
        own = ERRORS_SCHEMA
    else:
        spec = next(o for o in source.outputs() if o.name == output)
        own = debezium_schema(spec.schema) if spec.envelope == DEBEZIUM else spec.schema
    return pa.schema([*LINEAGE_FIELDS, *own])


def _frontier(offset: Mapping[str, int]) -> Frontier:
    return Frontier({decode_partition(key): value for key, value in offset.items()})


def _offset(frontier: Frontier) -> dict[str, int]:
    return {encode_partition(partition): position for partition, position in frontier.items()}

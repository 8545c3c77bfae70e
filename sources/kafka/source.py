"""The Kafka source itself: :class:`KafkaSource` checks its options and wires the stages into
the :class:`~reclock.sources.base.Source` protocol.

Each method of the protocol is one stage in its own module: ``upper`` is the probe
(:mod:`reclock.sources.kafka.probe`), ``splits`` the cut (:mod:`reclock.sources.kafka.splits`), ``read`` the
reader (:mod:`reclock.sources.kafka.reader`), ``commit`` the committer (:mod:`reclock.sources.kafka.committer`).
The source owns their shared parts: the routing (:mod:`reclock.sources.kafka.config`), the clients
(:mod:`reclock.sources.kafka.clients`) and the prober's driver-side state. It pickles without clients, so
it can travel to Spark executors, where only :meth:`KafkaSource.read` runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from reclock.envelope import DEBEZIUM
from reclock.errors import ConfigError
from reclock.sources.base import (
    GroupReads,
    KeepsUnknownFields,
    Output,
    RecordErrorPolicy,
    SettableOffsets,
    SourceBase,
    SourceContext,
    Split,
    check_record_error_policy,
)
from reclock.sources.kafka.batches import Fetched
from reclock.sources.kafka.clients import KafkaClients, check_client_settings
from reclock.sources.kafka.committer import commit_offsets
from reclock.sources.kafka.config import (
    ISOLATION_LEVELS,
    POLICIES,
    KafkaRoute,
    Policy,
    Routing,
    build_routes,
    check_bootstrap,
    check_choice,
    check_selection,
    check_start,
    kafka_partition,
)
from reclock.sources.kafka.decoding import decode
from reclock.sources.kafka.probe import Prober
from reclock.sources.kafka.reader import read_splits
from reclock.sources.kafka.splits import KafkaSplit, cut
from reclock.timeline.frontier import Frontier, Partition, Reread

__all__ = ["KafkaSource"]


class KafkaSource(SourceBase, GroupReads, SettableOffsets, KeepsUnknownFields):
    """Kafka topics as a reclock source; see :mod:`reclock.sources.kafka` for the contract.

    Topic selection: ``topics`` (a list) or ``pattern`` (a regex matched against whole topic
    names; internal ``__*`` topics are excluded). Outputs: ``outputs`` maps an output name to its
    options ``{"topics": [...] | "pattern": "...", "format": ..., "schema": ..., "metadata": ...,
    "key": [...], "envelope": ...}``; without it, each listed topic gets an output named after it
    (:func:`output_name_for`), and a ``pattern`` source gets one output named after the pattern.
    The format options given to the constructor (``format``, ``schema``, ``delimiter``,
    ``quote_char``, ``avro_schema``, ``confluent``, ``schema_registry``, ``reader_schema``,
    ``metadata``, ``key_format``) are the defaults every output inherits. With
    ``schema_registry``, ``avro``, ``protobuf`` and ``json`` values are in the Confluent wire
    format and decode with their writer's schema (:mod:`reclock.sources.decode.confluent`); so do
    keys with ``key_format`` ``avro``, ``protobuf`` or ``json`` (a struct ``key`` column whose
    fields come from ``key_schema``, by default subject ``<topic>-key``). ``metadata`` names record
    metadata to add as columns: a list of ``key``, ``headers``, ``topic``, ``partition``,
    ``offset``, ``timestamp``, or a mapping from those to column names.

    ``isolation_level`` is ``"read_committed"`` (the default: records of aborted transactions are
    dropped, the upper stops at the last stable offset, so an open transaction holds it back) or
    ``"read_uncommitted"`` (every record, up to the high watermark). A partition held by an open
    transaction for ``open_transaction_warning_s`` is named by :meth:`warnings`.
    """

    #: Rows per Arrow batch that :meth:`read` yields (bounded memory per task).
    flush_rows: int = 50_000

    #: Reads share nothing but the client pool, which is locked: threads may read at once.
    parallel_reads = True
    #: An offset is one record; a partition set below its bound is read again as a Reread.
    rereads = True

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        topics: Sequence[str] | None = None,
        pattern: str | None = None,
        outputs: Mapping[str, Mapping[str, Any]] | None = None,
        format: str = "bytes",
        schema: pa.Schema | None = None,
        delimiter: str = ",",
        quote_char: str = '"',
        avro_schema: str | Mapping[str, Any] | None = None,
        confluent: bool = False,
        avro_writer_schemas: Mapping[Any, Any] | None = None,
        schema_registry: str | Mapping[str, Any] | None = None,
        reader_schema: Mapping[str, Any] | None = None,
        key_schema: Mapping[str, Any] | None = None,
        metadata: Sequence[str] | Mapping[str, str] = (),
        key_format: str = "bytes",
        start: str | Mapping[Any, int] = "earliest",
        on_record_error: RecordErrorPolicy = "skip",
        on_offset_lost: Policy = "fail",
        group_id: str | None = None,
        client_settings: Mapping[str, Any] | None = None,
        max_split_offsets: int = 1_000_000,
        read_timeout_s: float = 30.0,
        isolation_level: str = "read_committed",
        open_transaction_warning_s: float = 60.0,
    ) -> None:
        servers = check_bootstrap(bootstrap_servers)
        selected_topics, selected_pattern = check_selection(topics, pattern)
        self.on_record_error = check_record_error_policy(on_record_error)
        self.on_offset_lost: Policy = check_choice("on_offset_lost", on_offset_lost, POLICIES)  # type: ignore[assignment]
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ConfigError("group_id", "must be a non-empty string or None")
        self.group_id = group_id
        settings = check_client_settings(client_settings)
        if not isinstance(max_split_offsets, int) or isinstance(max_split_offsets, bool) or max_split_offsets < 1:
            raise ConfigError("max_split_offsets", f"must be an int >= 1, got {max_split_offsets!r}")
        self.max_split_offsets = max_split_offsets
        if not isinstance(read_timeout_s, (int, float)) or isinstance(read_timeout_s, bool) or read_timeout_s <= 0:
            raise ConfigError("read_timeout_s", f"must be a number > 0, got {read_timeout_s!r}")
        self.isolation_level = check_choice("isolation_level", isolation_level, ISOLATION_LEVELS)
        warn_s = open_transaction_warning_s
        if not isinstance(warn_s, (int, float)) or isinstance(warn_s, bool) or warn_s < 0:
            raise ConfigError("open_transaction_warning_s", f"must be a number >= 0, got {warn_s!r}")
        defaults = {
            "format": format,
            "schema": schema,
            "delimiter": delimiter,
            "quote_char": quote_char,
            "avro_schema": avro_schema,
            "confluent": confluent,
            "avro_writer_schemas": avro_writer_schemas,
            "schema_registry": schema_registry,
            "reader_schema": reader_schema,
            "key_schema": key_schema,
            "metadata": metadata,
            "key_format": key_format,
        }
        routes = build_routes(selected_topics, selected_pattern, outputs, defaults)
        self.start = check_start(start)
        self._routing = Routing(selected_topics, selected_pattern, routes)
        committed = self.isolation_level == "read_committed"
        self._clients = KafkaClients(servers, settings, float(read_timeout_s), read_committed=committed)
        self._prober = Prober(self._clients, self._routing, self.start, open_transaction_warning_s=float(warn_s))

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> KafkaSource:
        """The pipeline's Kafka source: it commits to the consumer group ``reclock-<pipeline>``
        unless ``group_id`` says otherwise, and bad records follow the pipeline's ``on_record_error``."""
        group = {"group_id": f"reclock-{context.pipeline}"}
        return cls(**{**group, **options, "on_record_error": context.on_record_error})

    @property
    def bootstrap_servers(self) -> str | list[str]:
        return self._clients.bootstrap_servers

    @property
    def topics(self) -> tuple[str, ...]:
        """The listed topics; empty when the source selects topics by :attr:`pattern`."""
        return self._routing.topics

    @property
    def pattern(self) -> str | None:
        return self._routing.pattern

    @property
    def read_timeout_s(self) -> float:
        return self._clients.read_timeout_s

    def keep_unknown_fields(self, outputs: Sequence[str]) -> None:
        """Hand each record's undeclared fields on (schema evolution): a JSON object's other keys,
        the fields of an Avro writer schema (``avro_writer_schemas``) the output lacks, or with a
        schema registry those of any writer schema."""
        routes = []
        for route in self._routing.routes:
            if route.name in outputs:
                if route.decoder.format not in ("json", "avro", "protobuf") or route.output.envelope == DEBEZIUM:
                    raise ConfigError(
                        f"outputs.{route.name}.schema_evolution",
                        f"a {route.decoder.format} {route.output.envelope} output has no fields to evolve",
                    )
                route = dataclasses.replace(route, decoder=dataclasses.replace(route.decoder, unknown_fields=True))
            routes.append(route)
        self._routing = dataclasses.replace(self._routing, routes=tuple(routes))

    # -- the Source protocol --------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        return [route.output for route in self._routing.routes]

    def upper(self) -> Frontier:
        """Probe: the last stable offset (``read_committed``) or the high watermark of every
        partition of every routed topic, joined with all earlier probes (never regresses). Raises
        :class:`SourceTimeout` if the broker does not answer, :class:`DefiniteSourceError` if a
        partition's end went back or a listed topic was deleted."""
        return self._prober.upper()

    def splits(self, lower: Frontier, upper: Frontier) -> Sequence[KafkaSplit]:
        """Splits of ``[max(lower, start position), upper)`` per partition of this source.

        The start position applies only where ``lower`` has never advanced (offset 0). An offset
        below the partition's low watermark is lost: :class:`DefiniteSourceError` with
        ``on_offset_lost="fail"``, else the split carries the lost range in ``lost_from``.
        """
        if upper.is_closed:
            raise ValueError("a Kafka source never closes; splits need a finite upper")
        todo = sorted(
            ((p, lower.offset(p), end) for p, end in upper.items() if end > lower.offset(p) and self._owns(p)),
            key=lambda item: kafka_partition(item[0]),
        )
        # A re-read's range is exactly what set-offsets bound: no start position applies, and a
        # range the topic lost by now is found lost by the reader like any other.
        again = [(p, begin, end) for p, begin, end in todo if isinstance(p, Reread)]
        live = [(kafka_partition(p), begin, end) for p, begin, end in todo if not isinstance(p, Reread)]
        out = [
            KafkaSplit(p, start, min(end, start + self.max_split_offsets))
            for p, begin, end in again
            for start in range(begin, end, self.max_split_offsets)
        ]
        if not live:
            return out
        fresh = [p for p, begin, _ in live if begin == 0]
        starts = self._prober.start_positions(fresh) if fresh else {}
        lows = self._low_watermarks([p for p, _, _ in live])
        return out + cut(
            live, starts, lows, on_offset_lost=self.on_offset_lost, max_split_offsets=self.max_split_offsets
        )

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Yield the records of ``split`` (exactly ``[start, end)``) as ``(output, batch)`` pairs.

        Runs on an executor, on a pooled client; replayable. Raises :class:`SourceTimeout` when
        the broker makes no progress for ``read_timeout_s``.
        """
        return self.read_group([split])

    def read_group(self, splits: Sequence[Split]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The records of a task's ``splits`` as one stream: all their partitions fetched in
        shared requests, a route's records decoded together across partitions (a batch may hold
        records of several splits). The data plane reads a task this way and falls back to
        :meth:`read`, split by split, to tell which splits fail."""
        for wave in _waves(splits):
            yield from read_splits(
                wave,
                self._routing,
                self._clients,
                flush_rows=self.flush_rows,
                on_offset_lost=self.on_offset_lost,
                on_record_error=self.on_record_error,
            )

    def warnings(self) -> list[str]:
        """Partitions an open transaction has held back for ``open_transaction_warning_s`` or
        longer, as of the last probe, each with the producer id when the broker shows it."""
        return self._prober.warnings()

    def commit(self, frontier: Frontier) -> None:
        """Commit the frontier's offsets of this source's partitions to ``group_id`` (offset =
        next to read). Advisory: logs a warning on failure, never raises."""
        commit_offsets(self._clients, self.group_id, frontier, lambda p: self._owns(p) and not isinstance(p, Reread))

    def close(self) -> None:
        """Close the driver-side clients (the probe and the committer)."""
        self._clients.close()

    def __repr__(self) -> str:
        selection = f"topics={list(self.topics)!r}" if self.topics else f"pattern={self.pattern!r}"
        settings = "<redacted>" if self._clients.settings else "{}"
        return (
            f"KafkaSource(bootstrap_servers={self.bootstrap_servers!r}, {selection}, "
            f"outputs={[r.name for r in self._routing.routes]!r}, start={self._start_repr()}, "
            f"group_id={self.group_id!r}, isolation_level={self.isolation_level!r}, client_settings={settings})"
        )

    # -- internals (the tests also drive the stages through them) ------------------------------

    @property
    def _probe_client(self) -> Any:
        return self._clients.probe_client

    @property
    def _commit_client(self) -> Any:
        return self._clients.commit_client

    def _route(self, topic: str) -> KafkaRoute | None:
        return self._routing.route(topic)

    def _owns(self, partition: Partition) -> bool:
        return self._routing.owns(partition)

    def _low_watermarks(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self._prober.low_watermarks(partitions)

    def earliest(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """The low watermarks of ``partitions`` (``reclock offsets`` shows them as *earliest*)."""
        owned = [kafka_partition(p) for p in partitions if self._owns(p) and not isinstance(p, Reread)]
        return {p: low for p, low in self._low_watermarks(owned).items()}

    def _shape(self, records: Fetched, encoded: str, topic: str, kpart: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        """:func:`~reclock.sources.kafka.reader.shape` with this source's route and ``on_record_error``."""
        route = self._routing.route(topic)
        assert route is not None, topic
        return decode([((topic, kpart), encoded, records)], route, fail=self.on_record_error == "fail")

    def _start_repr(self) -> str:
        if isinstance(self.start, str):
            return repr(self.start)
        if "timestamp" in self.start:
            return repr({"timestamp": self.start["timestamp"]})
        return f"<{len(self.start)} partition offsets>"


def _waves(splits: Sequence[Split]) -> list[list[Split]]:
    """``splits`` in groups that each read a Kafka partition at most once.

    One fetch stream holds one position per Kafka partition, so a re-read range and the live
    range of the same partition (or two re-reads of it) are read one after the other.
    """
    waves: list[list[Split]] = []
    taken: list[set[tuple[str, int]]] = []
    for split in splits:
        kafka = kafka_partition(split.partition)
        for wave, seen in zip(waves, taken, strict=True):
            if kafka not in seen:
                wave.append(split)
                seen.add(kafka)
                break
        else:
            waves.append([split])
            taken.append({kafka})
    return waves

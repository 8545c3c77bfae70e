"""Options of the Kafka source: their checks and the routing of topics to outputs.

Everything here runs once, in :class:`~reclock.sources.kafka.KafkaSource`'s constructor, so a bad option
is a :class:`~reclock.errors.ConfigError` naming the option before any broker is contacted. The
result is immutable: a :class:`Routing` (which topics the source reads and the :class:`KafkaRoute`
each one feeds) that the probe, the splits and the reader consult.

Routing rules: each topic routes to exactly one output. Without ``outputs``, each listed topic gets
an output named after it (:func:`output_name_for`) and a ``pattern`` source gets one output named
after the pattern. With ``outputs``, an output names its ``topics`` or a ``pattern``; at most one
output names neither and catches every selected topic the others do not (it is tried last).
Internal ``__*`` topics are never selected by a pattern.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from reclock.envelope import APPEND, DEBEZIUM, ENVELOPES
from reclock.errors import ConfigError
from reclock.sources.base import Output, debezium_schema
from reclock.sources.decode import Decoder, RegistryDecoder, as_schema, make_decoder, make_registry_decoder
from reclock.timeline.frontier import Partition, Reread, decode_partition, encode_partition

__all__ = [
    "ISOLATION_LEVELS",
    "KEY_FORMATS",
    "METADATA_COLUMNS",
    "POLICIES",
    "KafkaRoute",
    "Policy",
    "Routing",
    "build_routes",
    "check_bootstrap",
    "check_choice",
    "check_selection",
    "check_start",
    "kafka_partition",
    "output_name_for",
]

Policy = Literal["fail", "skip"]

#: Record metadata an output can carry as columns, with their Arrow types (``key`` may be text).
METADATA_COLUMNS: dict[str, pa.DataType] = {
    "key": pa.binary(),
    "headers": pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("ms", tz="UTC"),
}

#: The choices of ``on_offset_lost`` (``on_record_error`` is the pipeline's, see
#: :data:`~reclock.sources.base.RecordErrorPolicy`).
POLICIES = ("fail", "skip")
#: The choices of ``isolation_level``, the default first (see :mod:`reclock.sources.kafka.transactions`).
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_START_WORDS = ("earliest", "latest")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_OUTPUT_KEYS = frozenset(
    {
        "topics",
        "pattern",
        "format",
        "schema",
        "delimiter",
        "quote_char",
        "avro_schema",
        "confluent",
        "avro_writer_schemas",
        "metadata",
        "key_format",
        "key",
        "envelope",
        "schema_registry",
        "reader_schema",
        "key_schema",
    }
)
#: ``key_format`` values: the key as it is, as UTF-8 text, or a registry format (a struct column).
KEY_FORMATS = ("bytes", "text", "avro", "protobuf", "json")


@dataclass(frozen=True)
class KafkaRoute:
    """One output's resolved configuration: which topics feed it and how records decode."""

    name: str
    topics: frozenset[str]
    pattern: re.Pattern[str] | None
    decoder: Decoder | RegistryDecoder
    metadata: tuple[tuple[str, str], ...]  # (metadata field, column name)
    key_format: Literal["bytes", "text", "avro", "protobuf", "json"]
    output: Output = field(compare=False)
    #: With a registry ``key_format``: the decoder of keys into the ``key`` column's struct.
    key_decoder: RegistryDecoder | None = None

    def matches(self, topic: str) -> bool:
        return topic in self.topics or (self.pattern is not None and self.pattern.fullmatch(topic) is not None)


@dataclass(frozen=True)
class Routing:
    """The source's topic selection (``topics`` or ``pattern``, never both) and its routes, the
    catch-all last. A topic is read only if it is selected *and* some route matches it."""

    topics: tuple[str, ...]
    pattern: str | None
    routes: tuple[KafkaRoute, ...]

    def route(self, topic: str) -> KafkaRoute | None:
        """The first route that matches ``topic``, or None when no output takes it."""
        for route in self.routes:
            if route.matches(topic):
                return route
        return None

    def selected(self, topic: str) -> bool:
        if self.topics:
            return topic in self.topics
        assert self.pattern is not None
        return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None

    def owns(self, partition: Partition) -> bool:
        """Whether ``partition`` is a ``(topic, partition)`` of this source, or a re-read of one
        (frontiers the runtime hands back may name other sources' partitions)."""
        if isinstance(partition, Reread):
            partition = partition.of
        return (
            isinstance(partition, tuple)
            and len(partition) == 2
            and isinstance(partition[0], str)
            and isinstance(partition[1], int)
            and self.selected(partition[0])
            and self.route(partition[0]) is not None
        )


def kafka_partition(partition: Partition) -> tuple[str, int]:
    """The ``(topic, partition)`` a partition of this source reads: its own, or the one a
    :class:`~reclock.timeline.frontier.Reread` copies."""
    return partition.of if isinstance(partition, Reread) else partition  # type: ignore[return-value]


def output_name_for(topic: str) -> str:
    """The default output name for a topic: an identifier (``orders.v1`` -> ``orders_v1``)."""
    name = re.sub(r"[^0-9A-Za-z_]+", "_", topic).strip("_").lower()
    name = re.sub(r"_+", "_", name)
    if not name:
        return "topic"
    return name if name[0].isalpha() else f"t_{name}"


def check_bootstrap(value: Any) -> str | list[str]:
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError("bootstrap_servers", "must not be empty")
        return value
    if isinstance(value, Sequence) and value and all(isinstance(v, str) and v.strip() for v in value):
        return list(value)
    raise ConfigError("bootstrap_servers", "must be 'host:port' or a non-empty list of them")


def check_selection(topics: Any, pattern: Any) -> tuple[tuple[str, ...], str | None]:
    if (topics is None) == (pattern is None):
        raise ConfigError("topics", "give exactly one of topics (a list) or pattern (a regex)")
    if topics is not None:
        if isinstance(topics, str) or not isinstance(topics, Sequence) or not topics:
            raise ConfigError("topics", "must be a non-empty list of topic names")
        for t in topics:
            if not isinstance(t, str) or not t:
                raise ConfigError("topics", f"topic names must be non-empty strings, got {t!r}")
        if len(set(topics)) != len(topics):
            raise ConfigError("topics", "lists a topic twice")
        return tuple(topics), None
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError("pattern", "must be a non-empty regex string")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError("pattern", f"invalid regex: {exc}") from exc
    return (), pattern


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_start(start: Any) -> str | dict[Any, int]:
    """``"earliest"``, ``"latest"``, ``{"timestamp": ms}`` or ``{(topic, partition): offset}``
    (keys may also be encoded partitions, as TOML can only spell them that way)."""
    if isinstance(start, str):
        if start not in _START_WORDS:
            raise ConfigError("start", f"must be 'earliest', 'latest' or a mapping, got {start!r}")
        return start
    if not isinstance(start, Mapping):
        raise ConfigError("start", "must be 'earliest', 'latest', {partition: offset} or {'timestamp': ms}")
    if "timestamp" in start:
        ts = start["timestamp"]
        if len(start) != 1 or not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
            raise ConfigError("start.timestamp", "must be the only key, an int of epoch milliseconds >= 0")
        return {"timestamp": ts}
    offsets: dict[Any, int] = {}
    for key, offset in start.items():
        partition = decode_partition(key) if isinstance(key, str) else key
        if not (
            isinstance(partition, tuple)
            and len(partition) == 2
            and isinstance(partition[0], str)
            and isinstance(partition[1], int)
            and not isinstance(partition[1], bool)
        ):
            raise ConfigError("start", f"partition keys are (topic, partition) tuples or '[\"topic\",0]', got {key!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ConfigError(f"start.{encode_partition(partition)}", f"offset must be an int >= 0, got {offset!r}")
        offsets[partition] = offset
    return offsets


def build_routes(
    topics: tuple[str, ...],
    pattern: str | None,
    outputs: Mapping[str, Mapping[str, Any]] | None,
    defaults: dict[str, Any],
) -> tuple[KafkaRoute, ...]:
    """One route per output, the catch-all last; ``defaults`` are the constructor's format
    options, which an output's own options override."""
    if outputs is None:
        if topics:
            names = [output_name_for(t) for t in topics]
            if len(set(names)) != len(names):
                raise ConfigError("outputs", f"topics {list(topics)} map to clashing output names {names}; name them")
            specs: dict[str, dict[str, Any]] = {n: {"topics": [t]} for n, t in zip(names, topics, strict=True)}
        else:
            specs = {output_name_for(pattern or ""): {}}
    else:
        if not isinstance(outputs, Mapping) or not outputs:
            raise ConfigError("outputs", "must be a non-empty mapping of output name to options")
        specs = {}
        for name, spec in outputs.items():
            if not isinstance(spec, Mapping):
                raise ConfigError(f"outputs.{name}", "options must be a mapping")
            specs[name] = dict(spec)
    routes = []
    catch_all = [n for n, s in specs.items() if "topics" not in s and "pattern" not in s]
    if len(catch_all) > 1:
        raise ConfigError("outputs", f"outputs {catch_all} name neither topics nor pattern; only one may")
    for name, spec in specs.items():
        routes.append(_build_route(name, spec, defaults))
    routes.sort(key=lambda r: r.name in catch_all)  # a catch-all output is tried last
    if topics:
        for t in topics:
            if not any(r.matches(t) or r.name in catch_all for r in routes):
                raise ConfigError("outputs", f"topic {t!r} is routed to no output")
    return tuple(routes)


def _build_route(name: str, spec: dict[str, Any], defaults: dict[str, Any]) -> KafkaRoute:
    where = f"outputs.{name}"
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(where, "an output name is an identifier starting with a letter")
    unknown = set(spec) - _OUTPUT_KEYS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}", f"unknown option; expected one of {sorted(_OUTPUT_KEYS)}")
    opts = {**defaults, **{k: v for k, v in spec.items() if k in defaults}}
    route_topics = spec.get("topics", ())
    if isinstance(route_topics, str) or not all(isinstance(t, str) and t for t in route_topics):
        raise ConfigError(f"{where}.topics", "must be a list of topic names")
    route_pattern = spec.get("pattern")
    compiled = None
    if route_pattern is not None:
        try:
            compiled = re.compile(route_pattern)
        except (re.error, TypeError) as exc:
            raise ConfigError(f"{where}.pattern", f"invalid regex: {exc}") from exc
    catch_all = "topics" not in spec and "pattern" not in spec
    if catch_all:
        compiled = re.compile(".*", re.DOTALL)
    envelope = spec.get("envelope", APPEND)
    if envelope not in ENVELOPES:
        raise ConfigError(f"{where}.envelope", f"must be append, upsert or debezium, got {envelope!r}")
    row_schema = as_schema(opts["schema"], field=f"{where}.format.schema")
    if envelope == DEBEZIUM and (opts["format"] != "json" or row_schema is None):
        raise ConfigError(f"{where}.envelope", 'debezium needs format = "json" and the row\'s schema')
    decoder = _value_decoder(where, envelope, opts, row_schema, route_topics)
    key_format = opts["key_format"]
    key_decoder = _key_decoder(where, key_format, opts, route_topics)
    metadata = _check_metadata(opts["metadata"], f"{where}.metadata")
    fields = list(row_schema) if row_schema is not None and envelope == DEBEZIUM else list(decoder.schema)
    for meta, column in metadata:
        ftype = METADATA_COLUMNS[meta]
        if meta == "key" and key_format == "text":
            ftype = pa.string()
        elif meta == "key" and key_decoder is not None:
            ftype = pa.struct(list(key_decoder.schema))
        fields.append(pa.field(column, ftype))
    names = [f.name for f in fields]
    clash = sorted({n for n in names if names.count(n) > 1} | {n for n in names if n.startswith("_")})
    if clash:
        raise ConfigError(f"{where}.metadata", f"column {clash[0]!r} clashes with another column or a lineage name")
    key = spec.get("key", ())
    if isinstance(key, str):
        key = (key,)
    key = tuple(key)
    missing = [k for k in key if k not in names]
    if missing:
        raise ConfigError(f"{where}.key", f"key column {missing[0]!r} is not a column of the output")
    output = Output(name, pa.schema(fields), key, envelope)
    return KafkaRoute(name, frozenset(route_topics), compiled, decoder, metadata, key_format, output, key_decoder)


def _value_decoder(
    where: str, envelope: str, opts: dict[str, Any], row_schema: pa.Schema | None, topics: Sequence[str]
) -> Decoder | RegistryDecoder:
    """An output's value decoder: a schema registry's (or protobuf's), or a plain format's."""
    if opts.get("schema_registry") is not None or opts["format"] == "protobuf":
        if envelope == DEBEZIUM:
            raise ConfigError(f"{where}.envelope", "debezium reads plain JSON, not registry formats")
        return make_registry_decoder(
            opts["format"],
            opts["schema"],
            schema_registry=opts.get("schema_registry"),
            reader_schema=opts.get("reader_schema"),
            default_subject=f"{topics[0]}-value" if len(topics) == 1 else None,
            field=where,
        )
    return make_decoder(
        opts["format"],
        debezium_schema(row_schema) if envelope == DEBEZIUM else opts["schema"],
        delimiter=opts["delimiter"],
        quote_char=opts["quote_char"],
        avro_schema=opts["avro_schema"],
        confluent=opts["confluent"],
        avro_writer_schemas=opts["avro_writer_schemas"],
        field=f"{where}.format",
    )


def _key_decoder(where: str, key_format: str, opts: dict[str, Any], topics: Sequence[str]) -> RegistryDecoder | None:
    """An output's key decoder, for keys in a registry format; ``None`` for ``bytes`` and ``text`` keys."""
    if key_format not in KEY_FORMATS:
        raise ConfigError(f"{where}.key_format", f"must be one of {', '.join(KEY_FORMATS)}, got {key_format!r}")
    if key_format not in ("bytes", "text"):
        if opts.get("schema_registry") is None:
            raise ConfigError(f"{where}.key_format", f"{key_format!r} keys need schema_registry")
        return make_registry_decoder(
            key_format,
            None,
            schema_registry=opts["schema_registry"],
            reader_schema=opts.get("key_schema"),
            default_subject=f"{topics[0]}-key" if len(topics) == 1 else None,
            field=where,
            reader_field="key_schema",
        )
    return None


def _check_metadata(metadata: Any, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(metadata, str):
        metadata = [metadata]
    if isinstance(metadata, Mapping):
        pairs = list(metadata.items())
    elif isinstance(metadata, Sequence):
        pairs = [(m, m) for m in metadata]
    else:
        raise ConfigError(where, "must be a list of metadata names or a mapping name -> column")
    for meta, column in pairs:
        if meta not in METADATA_COLUMNS:
            raise ConfigError(where, f"unknown metadata {meta!r}; expected one of {', '.join(METADATA_COLUMNS)}")
        if not isinstance(column, str) or not column:
            raise ConfigError(where, f"column name for {meta!r} must be a non-empty string")
    return tuple(pairs)

"""Pipeline definitions: a TOML file, validated before anything runs.

Every mistake is reported as one :class:`~reclock.errors.ConfigError` naming the file and the
field (``pipeline.max_batch: expected an integer, got 'lots'``), never as a traceback from deep
inside a source. Strings may reference environment variables as ``${NAME}``: they are expanded
only when the source is built, so secrets stay out of the stored definition and of every log.

Example::

    [pipeline]
    name = "auctions"
    lake = "lake"              # relative to the config file
    engine = "spark"           # or "local": the in-driver data plane, no JVM
    batch_interval = 1.0
    on_record_error = "skip"   # or "fail": a record that does not decode fails the batch

    [spark]
    master = "local[2]"

    [storage_options]          # only for a lake in an object store: lake = "s3://bucket/prefix"
    endpoint = "${S3_ENDPOINT}"
    secret_access_key = "${S3_SECRET}"

    [maintenance]              # optional; these are the defaults
    every = 500                # batches between the job's own table maintenance (0: never)
    history_minutes = 0        # upsert outputs' as-of reads and time travel stay exact this far back
    target_file_mb = 128       # optimize compacts output files to about this size

    [lease]                    # optional: the job's lease in the lake (one driver per pipeline)
    ttl_seconds = 30.0         # renewed every third of it; another driver may take over after it

    [source]
    kind = "generator"
    rate = 20000
    limit = 200000

    [outputs.bids]             # optional, per output (see docs/schema.md)
    partition_by = ["_into_date"]
    schema_evolution = "none"  # fail, add or rescue for sources that decode fields

    [outputs.big_bids]         # optional: shaped outputs (docs/shaping.md)
    from = "bids"
    sql = "SELECT auction, price FROM input WHERE price > 1000"
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from reclock.errors import ConfigError
from reclock.job.plugins import source_class, source_options
from reclock.job.secrets import conceal, expand, hidden
from reclock.persist.layout import OutputLayout, layouts_to_dict, parse_layouts
from reclock.persist.lease import DEFAULT_TTL_S
from reclock.persist.store import check_storage_options
from reclock.runtime.outputs import awaited_shapes
from reclock.runtime.settings import Maintenance, Settings
from reclock.runtime.shaping import Shape, route_outputs, shapes_from_toml, shapes_to_toml
from reclock.runtime.windows import Window, parse_windows
from reclock.sources.base import RecordErrorPolicy, Source, SourceContext, TakesContext, check_record_error_policy

__all__ = [
    "PipelineConfig",
    "build_source",
    "check_shapes",
    "load_config",
    "parse_config",
]

_ENGINES = ("spark", "local")
_METRICS_KEYS = ("metrics_port", "metrics_host")
#: A pipeline policy that older definitions (and the source guides) write under ``[source]``.
_RECORD_ERROR = "on_record_error"
#: ``[pipeline]`` keys besides the runtime's :class:`Settings`.
_PIPELINE_KEYS = ("name", "lake", "engine", "status_retention_days", _RECORD_ERROR, *_METRICS_KEYS)
_MIN_TTL_S = 1.0  # renewals every third of it must fit the store's round trips
#: Seconds a job waits for its Spark session: a local one starts in 5-20 s on a loaded machine.
DEFAULT_SPARK_START_TIMEOUT_S = 120.0
_SPARK_KEYS = {"master", "conf", "small_batch_offsets", "background_start", "start_timeout_seconds", "ui"}


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    lake: str
    source: Mapping[str, Any]
    settings: Settings = field(default_factory=Settings)
    engine: str = "spark"
    spark_master: str = "local[2]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    status_retention_days: float = 7.0
    metrics_port: int | None = None
    small_batch_offsets: int = 20_000
    maintenance: Maintenance = field(default_factory=Maintenance)
    spark_background_start: bool = True
    lease_ttl_s: float = DEFAULT_TTL_S
    #: How ``create`` reaches an object-store lake, as written (``${NAME}`` not expanded). Not part
    #: of the stored definition: they say how to reach the lake, which a reader of it already knew.
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: Tumbling windows over the outputs, each into its own table (``[[windows]]``, docs/windows.md).
    windows: tuple[Window, ...] = ()
    #: Per output: its partition columns and schema evolution policy (``[outputs.<name>]``).
    layouts: Mapping[str, OutputLayout] = field(default_factory=dict)
    #: The address ``/metrics`` binds to: loopback unless the operator opens it on purpose.
    metrics_host: str = "127.0.0.1"
    #: ``[outputs.<name>]``: outputs shaped from the source's, by SQL (see :mod:`reclock.runtime.shaping`).
    shapes: tuple[Shape, ...] = ()
    #: What a record that cannot be decoded does: lands in ``_errors`` (``skip``) or fails the
    #: batch (``fail``). Written in ``[pipeline]``, or in ``[source]`` where it stays as written.
    on_record_error: RecordErrorPolicy = "skip"
    #: ``[spark] start_timeout_seconds``: how long the job waits for its Spark session before failing.
    spark_start_timeout_s: float = DEFAULT_SPARK_START_TIMEOUT_S
    #: ``[spark] ui``: serve Spark's own web UI (off: a web server and a port nobody asked for).
    spark_ui: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The stored definition: exactly what a TOML file with these values would say, less
        ``[storage_options]`` (credentials never go into the lake)."""
        pipeline = {
            "name": self.name,
            "lake": self.lake,
            "engine": self.engine,
            "status_retention_days": self.status_retention_days,
        }
        if self.metrics_port is not None:
            pipeline["metrics_port"] = self.metrics_port
        if self.metrics_host != "127.0.0.1":  # stored only when set, so older definitions compare equal
            pipeline["metrics_host"] = self.metrics_host
        if self.on_record_error != "skip" and _RECORD_ERROR not in self.source:
            pipeline[_RECORD_ERROR] = self.on_record_error
        pipeline.update({f.name: getattr(self.settings, f.name) for f in fields(Settings)})
        return (
            {
                "pipeline": pipeline,
                "spark": {
                    "master": self.spark_master,
                    "conf": dict(self.spark_conf),
                    "small_batch_offsets": self.small_batch_offsets,
                    "background_start": self.spark_background_start,
                }
                # stored only when set, so older definitions compare equal
                | ({"ui": True} if self.spark_ui else {})
                | (
                    {"start_timeout_seconds": self.spark_start_timeout_s}
                    if self.spark_start_timeout_s != DEFAULT_SPARK_START_TIMEOUT_S
                    else {}
                ),
                "maintenance": {f.name: getattr(self.maintenance, f.name) for f in fields(Maintenance)},
                "source": dict(self.source),
                **({"outputs": outputs} if (outputs := _outputs_to_dict(self.layouts, self.shapes)) else {}),
            }
            | ({"windows": [w.to_dict() for w in self.windows]} if self.windows else {})
            | ({"lease": {"ttl_seconds": self.lease_ttl_s}} if self.lease_ttl_s != DEFAULT_TTL_S else {})
        )


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a TOML file; a file that cannot be read is a :class:`ConfigError` too."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
        raw = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError("file", "does not exist", file=str(path)) from None
    except IsADirectoryError:
        raise ConfigError("file", "is a directory, not a TOML file", file=str(path)) from None
    except OSError as exc:
        raise ConfigError("file", f"cannot be read: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("file", f"is not UTF-8 text (byte {exc.start}: {exc.reason})", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("syntax", str(exc), file=str(path)) from None
    return parse_config(raw, file=str(path), base=path.parent)


def parse_config(raw: Mapping[str, Any], *, file: str | None = None, base: Path | None = None) -> PipelineConfig:
    """Validate a definition already parsed from TOML (or JSON); relative lakes resolve at ``base``."""

    def fail(name: str, message: str) -> ConfigError:
        return ConfigError(name, message, file=file)

    _only(
        raw, {"pipeline", "spark", "maintenance", "lease", "source", "storage_options", "windows", "outputs"}, "", fail
    )
    pipeline = _section(raw, "pipeline", fail, required=True)
    storage_options = dict(_section(raw, "storage_options", fail))
    try:
        check_storage_options(storage_options)
    except ConfigError as exc:
        raise fail(exc.field, exc.reason) from None
    spark = _section(raw, "spark", fail)
    maintenance = _maintenance(_section(raw, "maintenance", fail), fail)
    lease = _section(raw, "lease", fail)
    _only(lease, {"ttl_seconds"}, "lease.", fail)
    ttl = _typed(lease, "ttl_seconds", float, "lease.", fail, default=DEFAULT_TTL_S)
    if not _MIN_TTL_S <= ttl < math.inf:
        raise fail("lease.ttl_seconds", f"must be a finite number of seconds >= {_MIN_TTL_S:g}, got {ttl!r}")
    source = dict(_section(raw, "source", fail, required=True))
    _only(pipeline, {*_PIPELINE_KEYS, *(f.name for f in fields(Settings))}, "pipeline.", fail)
    _only(spark, _SPARK_KEYS, "spark.", fail)

    top = _pipeline_options(pipeline, base, fail)
    spark_options = _spark_options(spark, fail)
    try:
        cls = source_class(source.get("kind"))
    except ConfigError as exc:
        raise fail(f"source.{exc.field}", exc.reason) from None
    _check_source_options(source["kind"], cls, source, fail)
    on_record_error = _record_error_policy(pipeline, source, fail)
    layouts, shapes = _outputs(_section(raw, "outputs", fail), fail)
    config = PipelineConfig(
        source=source,
        maintenance=maintenance,
        lease_ttl_s=ttl,
        storage_options=storage_options,
        windows=parse_windows(raw.get("windows"), file),
        layouts=layouts,
        shapes=shapes,
        on_record_error=on_record_error,
        **top,
        **spark_options,
    )
    from reclock.persist.lake import NAME_PATTERN, NAME_RULE

    if not NAME_PATTERN.match(name := config.name):
        raise fail("pipeline.name", f"{name!r} is not an identifier: {NAME_RULE} (such as {_as_name(name)!r})")
    return config


def _pipeline_options(
    pipeline: Mapping[str, Any], base: Path | None, fail: Callable[[str, str], ConfigError]
) -> dict[str, Any]:
    """``[pipeline]``: its own keys and the runtime's :class:`Settings`, as :class:`PipelineConfig`'s fields."""
    name = _typed(pipeline, "name", str, "pipeline.", fail, required=True)
    lake = _typed(pipeline, "lake", str, "pipeline.", fail, default="lake")
    if base is not None and "://" not in lake and not os.path.isabs(os.path.expanduser(lake)):
        lake = str((base / lake).resolve())
    engine = _typed(pipeline, "engine", str, "pipeline.", fail, default="spark")
    retention = _typed(pipeline, "status_retention_days", float, "pipeline.", fail, default=7.0)
    if not 0 < retention < math.inf:
        raise fail("pipeline.status_retention_days", f"must be a finite number > 0, got {retention!r}")
    metrics_port = _typed(pipeline, "metrics_port", int, "pipeline.", fail)
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise fail("pipeline.metrics_port", "must be a port number (0 picks a free one)")
    metrics_host = _typed(pipeline, "metrics_host", str, "pipeline.", fail, default="127.0.0.1")
    if not metrics_host.strip():
        raise fail("pipeline.metrics_host", "must be an address to bind to, such as 127.0.0.1 or 0.0.0.0")
    if engine not in _ENGINES:
        raise fail("pipeline.engine", f"must be one of {', '.join(_ENGINES)}, got {engine!r}")
    knobs = {}
    for f in fields(Settings):
        kind = {"float": float, "bool": bool}.get(str(f.type), int)
        if f.name in pipeline:
            knobs[f.name] = _typed(pipeline, f.name, kind, "pipeline.", fail)
    try:
        settings = Settings(**knobs)
    except ConfigError as exc:
        raise fail(f"pipeline.{exc.field}", exc.reason) from None
    return {
        "name": name,
        "lake": lake,
        "settings": settings,
        "engine": engine,
        "status_retention_days": retention,
        "metrics_port": metrics_port,
        "metrics_host": metrics_host,
    }


def _spark_options(spark: Mapping[str, Any], fail: Callable[[str, str], ConfigError]) -> dict[str, Any]:
    """``[spark]``, as :class:`PipelineConfig`'s ``spark_*`` fields."""
    master = _typed(spark, "master", str, "spark.", fail, default="local[2]")
    small = _typed(spark, "small_batch_offsets", int, "spark.", fail, default=20_000)
    if small < 0:
        raise fail("spark.small_batch_offsets", "must be >= 0 (0 sends every batch to Spark)")
    background = _typed(spark, "background_start", bool, "spark.", fail, default=True)
    start_timeout = _typed(spark, "start_timeout_seconds", float, "spark.", fail, default=DEFAULT_SPARK_START_TIMEOUT_S)
    if not 0 < start_timeout < math.inf:
        raise fail("spark.start_timeout_seconds", f"must be a finite number of seconds > 0, got {start_timeout!r}")
    ui = _typed(spark, "ui", bool, "spark.", fail, default=False)
    conf = spark.get("conf", {})
    if not isinstance(conf, Mapping):
        raise fail("spark.conf", "must be a table of Spark settings")
    return {
        "spark_master": master,
        "spark_conf": {str(k): str(v) for k, v in conf.items()},
        "small_batch_offsets": small,
        "spark_background_start": background,
        "spark_start_timeout_s": start_timeout,
        "spark_ui": ui,
    }


def _as_name(text: str) -> str:
    """``text`` made a name: ``orders-eu`` becomes ``orders_eu``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)[:64] or "pipeline"
    return name if not name[0].isdigit() else f"_{name[:63]}"


_LAYOUT_KEYS = ("partition_by", "schema_evolution")
_SHAPE_KEYS = ("from", "sql")


def _outputs(
    section: Mapping[str, Any], fail: Callable[[str, str], ConfigError]
) -> tuple[dict[str, OutputLayout], tuple[Shape, ...]]:
    """``[outputs.<name>]``: how an output is laid out (``partition_by``, ``schema_evolution``, see
    :mod:`reclock.persist.layout`) and, for a shaped output, what it is made of (``from``, ``sql``,
    see :mod:`reclock.runtime.shaping`). One table may say both."""
    layouts: dict[str, dict[str, Any]] = {}
    shapes: dict[str, dict[str, Any]] = {}
    for name, spec in section.items():
        if not isinstance(spec, Mapping):
            raise fail(f"outputs.{name}", "must be a table")
        unknown = sorted(set(spec) - {*_LAYOUT_KEYS, *_SHAPE_KEYS})
        if unknown:
            raise fail(f"outputs.{name}.{unknown[0]}", f"unknown key (known: {', '.join(_SHAPE_KEYS + _LAYOUT_KEYS)})")
        if layout := {k: v for k, v in spec.items() if k in _LAYOUT_KEYS}:
            layouts[name] = layout
        if shape := {k: v for k, v in spec.items() if k in _SHAPE_KEYS}:
            shapes[name] = shape
    try:
        return parse_layouts(layouts), shapes_from_toml(shapes)
    except ConfigError as exc:
        raise fail(exc.field, exc.reason) from None


def _outputs_to_dict(layouts: Mapping[str, OutputLayout], shapes: tuple[Shape, ...]) -> dict[str, dict[str, Any]]:
    """The ``[outputs]`` tables :func:`_outputs` reads back."""
    outputs: dict[str, dict[str, Any]] = {}
    for name, table in [*layouts_to_dict(layouts).items(), *shapes_to_toml(shapes).items()]:
        outputs.setdefault(name, {}).update(table)
    return outputs


def _maintenance(section: Mapping[str, Any], fail: Callable[[str, str], ConfigError]) -> Maintenance:
    names = [f.name for f in fields(Maintenance)]
    _only(section, set(names), "maintenance.", fail)
    knobs = {name: _typed(section, name, int, "maintenance.", fail) for name in names if name in section}
    try:
        return Maintenance(**knobs)
    except ConfigError as exc:
        raise fail(f"maintenance.{exc.field}", exc.reason) from None


def build_source(
    config: PipelineConfig,
    *,
    created_at_ms: int,
    file: str | None = None,
    generations_reader: Callable[[], str | None] | None = None,
    generations_path: str | None = None,
    state_path: str | None = None,
    state_options: Mapping[str, str] | None = None,
) -> Source:
    """Instantiate the configured source; its own validation errors are prefixed ``source.``.

    What only the runtime knows goes into a :class:`~reclock.sources.base.SourceContext`, which a
    source class takes in its ``from_config`` (:class:`~reclock.sources.base.TakesContext`): the
    pipeline, when it was created, its ``on_record_error`` policy, and where dropped files'
    generations are kept (a reader of that file, and its path in a local lake), and a folder for a
    source's own durable state (in the lake, with the lake's storage options). Any other class
    is called with the ``[source]`` options alone.
    """
    options = {k: expand(v, f"source.{k}", file) for k, v in config.source.items() if k not in ("kind", _RECORD_ERROR)}
    secrets = hidden(config.source, options)
    try:
        cls = source_class(config.source["kind"])
    except ConfigError as exc:
        raise ConfigError(f"source.{exc.field}", exc.reason, file=file) from None
    context = SourceContext(
        config.name,
        created_at_ms,
        config.on_record_error,
        generations_reader,
        generations_path,
        state_path,
        dict(state_options or {}),
    )
    try:
        built = cls.from_config(options, context) if issubclass(cls, TakesContext) else cls(**options)
        return cast(Source, built)  # source_class checked the class has the protocol's methods
    except ConfigError as exc:
        message = conceal(exc.reason, secrets)
        raise ConfigError(f"source.{exc.field}", message, file=file) from None
    except (TypeError, ValueError) as exc:  # a source that did not say which option: still one line
        raise ConfigError("source", conceal(f"{type(exc).__name__}: {exc}", secrets), file=file) from None


def check_shapes(config: PipelineConfig, source: Source, *, file: str | None = None) -> None:
    """``[outputs]`` against the source's outputs, before anything is stored (see :func:`route_outputs`);
    those of an output that may join the source later are checked when it joins (:func:`awaited_shapes`)."""
    outputs = {o.name: o for o in source.outputs()}
    try:
        route_outputs(outputs, awaited_shapes(source, outputs, config.shapes)[0])
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.reason, file=file) from None


def _check_source_options(
    kind: str, cls: type, source: Mapping[str, Any], fail: Callable[[str, str], ConfigError]
) -> None:
    """Options the class's constructor cannot take, or lacks, named before anything is built.

    The values themselves are the source's to judge: its constructor raises a ConfigError naming
    the option, which :func:`build_source` prefixes with ``source.``.
    """
    options = source_options(cls)
    for name in options.required:
        if name not in source:
            raise fail(f"source.{name}", f"missing (a {kind} source needs it)")
    if options.open:
        return
    for key in source:
        if key not in ("kind", _RECORD_ERROR) and key not in options.known:
            known = ", ".join(sorted(options.known))
            raise fail(f"source.{key}", f"unknown option for a {kind} source (known: {known})")


def _record_error_policy(
    pipeline: Mapping[str, Any], source: Mapping[str, Any], fail: Callable[[str, str], ConfigError]
) -> RecordErrorPolicy:
    """``on_record_error``, one policy for the pipeline, from ``[pipeline]`` or (as the source
    guides long wrote it) from ``[source]``; never from both, which could disagree."""
    if _RECORD_ERROR in pipeline and _RECORD_ERROR in source:
        raise fail(f"source.{_RECORD_ERROR}", "is set in [pipeline] too; say it once, in [pipeline]")
    section = "pipeline" if _RECORD_ERROR in pipeline else "source"
    try:
        return check_record_error_policy({**source, **pipeline}.get(_RECORD_ERROR, "skip"))
    except ConfigError as exc:
        raise fail(f"{section}.{exc.field}", exc.reason) from None


def _section(raw: Mapping[str, Any], name: str, fail: Callable[..., ConfigError], required: bool = False) -> Mapping:
    if name not in raw:
        if required:
            raise fail(name, "missing section")
        return {}
    value = raw[name]
    if not isinstance(value, Mapping):
        raise fail(name, "must be a table")
    return value


def _only(section: Mapping[str, Any], allowed: set[str], prefix: str, fail: Callable[..., ConfigError]) -> None:
    for key in section:
        if key not in allowed:
            raise fail(f"{prefix}{key}", f"unknown key (known: {', '.join(sorted(allowed))})")


def _typed(
    section: Mapping[str, Any],
    key: str,
    kind: type,
    prefix: str,
    fail: Callable[..., ConfigError],
    *,
    required: bool = False,
    default: Any = None,
) -> Any:
    if key not in section:
        if required:
            raise fail(f"{prefix}{key}", "missing")
        return default
    value = section[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
        raise fail(f"{prefix}{key}", f"expected {names[kind]}, got {value!r}")
    return value

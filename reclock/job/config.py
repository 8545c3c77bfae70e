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
from reclock.job.sections import (
    DEFAULT_SPARK_START_TIMEOUT_S,
    LeaseSection,
    PipelineSection,
    SparkSection,
    keys_of,
    parse_section,
)
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

_METRICS_KEYS = ("metrics_port", "metrics_host")
#: A pipeline policy that older definitions (and the source guides) write under ``[source]``.
_RECORD_ERROR = "on_record_error"


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
    """Validate a definition already parsed from TOML (or JSON); relative lakes resolve at ``base``.

    Each section is read into its frozen value (:mod:`reclock.job.sections`, and the runtime's
    :class:`Settings` and :class:`Maintenance`) by one typed parser; unknown keys are named first."""

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
    maintenance_section = _section(raw, "maintenance", fail)
    _only(maintenance_section, keys_of(Maintenance), "maintenance.", fail)
    maintenance = parse_section(Maintenance, maintenance_section, "maintenance.", fail)
    lease_section = _section(raw, "lease", fail)
    _only(lease_section, keys_of(LeaseSection), "lease.", fail)
    lease = parse_section(LeaseSection, lease_section, "lease.", fail)
    source = dict(_section(raw, "source", fail, required=True))
    _only(pipeline, {*keys_of(PipelineSection), _RECORD_ERROR, *keys_of(Settings)}, "pipeline.", fail)
    _only(spark, keys_of(SparkSection), "spark.", fail)
    top = parse_section(PipelineSection, pipeline, "pipeline.", fail)
    settings = parse_section(Settings, pipeline, "pipeline.", fail)
    sparks = parse_section(SparkSection, spark, "spark.", fail)
    try:
        cls = source_class(source.get("kind"))
    except ConfigError as exc:
        raise fail(f"source.{exc.field}", exc.reason) from None
    _check_source_options(source["kind"], cls, source, fail)
    on_record_error = _record_error_policy(pipeline, source, fail)
    layouts, shapes = _outputs(_section(raw, "outputs", fail), fail)
    lake = top.lake
    if base is not None and "://" not in lake and not os.path.isabs(os.path.expanduser(lake)):
        lake = str((base / lake).resolve())
    config = PipelineConfig(
        name=top.name,
        lake=lake,
        source=source,
        settings=settings,
        engine=top.engine,
        spark_master=sparks.master,
        spark_conf={str(k): str(v) for k, v in sparks.conf.items()},
        status_retention_days=top.status_retention_days,
        metrics_port=top.metrics_port,
        small_batch_offsets=sparks.small_batch_offsets,
        maintenance=maintenance,
        spark_background_start=sparks.background_start,
        lease_ttl_s=lease.ttl_seconds,
        storage_options=storage_options,
        windows=parse_windows(raw.get("windows"), file),
        layouts=layouts,
        metrics_host=top.metrics_host,
        shapes=shapes,
        on_record_error=on_record_error,
        spark_start_timeout_s=sparks.start_timeout_seconds,
        spark_ui=sparks.ui,
    )
    from reclock.persist.lake import NAME_PATTERN, NAME_RULE

    if not NAME_PATTERN.match(name := config.name):
        raise fail("pipeline.name", f"{name!r} is not an identifier: {NAME_RULE} (such as {_as_name(name)!r})")
    return config


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
        pipeline=config.name,
        created_at_ms=created_at_ms,
        on_record_error=config.on_record_error,
        generations_reader=generations_reader,
        generations_path=generations_path,
        state_path=state_path,
        state_options=dict(state_options or {}),
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

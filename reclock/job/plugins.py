"""Source kinds: what ``source.kind`` in a pipeline definition may name, and the class it means.

A kind is resolved in this order, by every process that builds the source (``create``, ``start``,
``status``, ``files``), from the stored definition, so a plugin is used exactly like a built-in:

1. a built-in kind: ``files``, ``generator``, ``kafka``, ``postgres``;
2. ``package.module:ClassName``: any importable class, for a source kept in your own code;
3. the name of an entry point in the group :data:`ENTRY_POINTS` (``reclock.sources``), declared by
   an installed distribution's metadata::

       [project.entry-points."reclock.sources"]
       sensorlog = "sensorlog.source:SensorLogSource"

Built-in names cannot be shadowed by a plugin: a definition that said ``kafka`` yesterday must not
run someone else's code after a ``pip install``. Every failure (unknown name, a module that does
not import, a class that is not a source, two distributions claiming one name) is a
:class:`~reclock.errors.ConfigError` on the field ``kind``: one line, no traceback.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from reclock.errors import ConfigError

__all__ = ["BUILT_IN", "ENTRY_POINTS", "SourceOptions", "installed_plugins", "source_class", "source_options"]

#: The entry point group third-party sources register under.
ENTRY_POINTS = "reclock.sources"

BUILT_IN = {
    "generator": "reclock.sources.generator:GeneratorSource",
    "kafka": "reclock.sources.kafka:KafkaSource",
    "files": "reclock.sources.files:FilesSource",
    "postgres": "reclock.sources.postgres:PostgresSource",
    "mysql": "reclock.sources.mysql:MysqlSource",
}

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: What a class needs to be driven as a source (the rest has defaults in ``SourceBase``).
_REQUIRED = ("outputs", "upper", "splits", "read")


def installed_plugins() -> dict[str, list[EntryPoint]]:
    """Plugin name -> the entry points declaring it (more than one is a conflict, refused on use)."""
    found: dict[str, list[EntryPoint]] = {}
    for point in entry_points(group=ENTRY_POINTS):
        if point.name not in BUILT_IN:
            found.setdefault(point.name, []).append(point)
    return found


def source_class(kind: object) -> type:
    """The class ``kind`` names; a :class:`ConfigError` on ``kind`` if it names none."""
    if isinstance(kind, str) and kind in BUILT_IN:
        return _load(kind, BUILT_IN[kind])
    if isinstance(kind, str) and _DOTTED.match(kind):
        return _load(kind, kind)
    plugins = installed_plugins()
    if isinstance(kind, str) and kind in plugins:
        points = plugins[kind]
        if len({p.value for p in points}) > 1:
            claims = ", ".join(sorted(f"{p.value} ({p.dist.name if p.dist else 'unknown'})" for p in points))
            raise ConfigError("kind", f"{kind!r} is declared by more than one installed plugin: {claims}")
        return _load(kind, points[0].value)
    known = ", ".join([*sorted(BUILT_IN), *(f"{name} (plugin)" for name in sorted(plugins))])
    raise ConfigError("kind", f"must be one of {known}, or 'package.module:ClassName', got {kind!r}")


@dataclass(frozen=True)
class SourceOptions:
    """The options a source kind takes: the keyword parameters of its class's constructor.

    Only to name a mistaken option before anything is built (a pipeline definition's ``[source]``,
    a Spark read's ``.option``); what the runtime hands a source is its
    :class:`~reclock.sources.base.SourceContext`, never a parameter found by its name.
    """

    required: tuple[str, ...]
    known: tuple[str, ...]
    #: The constructor takes ``**kwargs``: any name may be an option.
    open: bool


def source_options(cls: type) -> SourceOptions:
    """The :class:`SourceOptions` of source class ``cls``."""
    params = [p for p in inspect.signature(cls).parameters.values() if p.kind is not p.VAR_POSITIONAL]
    named = [p for p in params if p.kind is not p.VAR_KEYWORD]
    return SourceOptions(
        required=tuple(p.name for p in named if p.default is p.empty),
        known=tuple(p.name for p in named),
        open=len(named) < len(params),
    )


def _load(kind: str, target: str) -> type:
    module_name, _, attribute = target.partition(":")
    try:
        value: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = f" (no module {exc.name!r})" if exc.name and exc.name != module_name else ""
        reason = f"{kind!r}: cannot import {module_name!r}{missing}; is its package installed?"
        raise ConfigError("kind", reason) from None
    except Exception as exc:  # a plugin's own import-time failure: still one line naming the kind
        raise ConfigError("kind", f"{kind!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    for part in attribute.split("."):
        value = getattr(value, part, None)
        if value is None:
            raise ConfigError("kind", f"{kind!r}: module {module_name!r} has no {attribute!r}")
    if not isinstance(value, type):
        raise ConfigError("kind", f"{kind!r}: {target} is not a class")
    missing_methods = [name for name in _REQUIRED if not callable(getattr(value, name, None))]
    if missing_methods:
        raise ConfigError(
            "kind", f"{kind!r}: {target} is not a source (no {', '.join(missing_methods)}; see reclock.SourceBase)"
        )
    return value

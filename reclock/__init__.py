"""reclock: exactly-once ingestion into Delta tables, every record stamped on one shared timeline.

Importing the package loads only the pure time model (no Spark, Delta or Kafka), so source authors
and tests can use :class:`Frontier` and :class:`Bindings` anywhere. The rest of the public surface
(a pipeline, the source protocol and its helpers, as-of reads) is importable from here too, and
loaded on first use::

    from reclock import Pipeline, Settings, SourceBase, Output, Split, Window, read_as_of, readable_upper
"""

from __future__ import annotations

import importlib
from typing import Any

from reclock.errors import ConfigError, ContractError, DefiniteSourceError, FencedError, ReclockError, TransientError
from reclock.timeline.bindings import Bindings
from reclock.timeline.frontier import Frontier, decode_partition, encode_partition
from reclock.timeline.stamp import UNBOUND, Stamper

#: Public names whose modules load Delta, Spark or pyarrow: imported when first asked for.
_LAZY = {
    "Pipeline": "reclock.runtime.pipeline",
    "BatchReport": "reclock.runtime.pipeline",
    "Settings": "reclock.runtime.settings",
    "Maintenance": "reclock.runtime.settings",
    "LocalDataPlane": "reclock.runtime.planes",
    "SparkDataPlane": "reclock.runtime.planes",
    "Source": "reclock.sources.base",
    "SourceBase": "reclock.sources.base",
    "Output": "reclock.sources.base",
    "Split": "reclock.sources.base",
    "error_batch": "reclock.sources.base",
    "read_as_of": "reclock.persist.asof",
    "read_as_of_spark": "reclock.persist.asof",
    "readable_upper": "reclock.persist.asof",
    "Lake": "reclock.persist.lake",
    "Window": "reclock.runtime.windows",
    "Shape": "reclock.runtime.shaping",
}

__all__ = [
    "UNBOUND",
    "Bindings",
    "ConfigError",
    "ContractError",
    "DefiniteSourceError",
    "FencedError",
    "Frontier",
    "ReclockError",
    "Stamper",
    "TransientError",
    "decode_partition",
    "encode_partition",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reclock' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

"""reclock: exactly-once ingestion into Delta tables, every record stamped on one shared timeline.

Importing the package loads only the pure time model (no Spark, Delta or Kafka), so source authors
and tests can use :class:`Frontier` and :class:`Bindings` anywhere.
"""

from reclock.bindings import Bindings
from reclock.errors import ConfigError, DefiniteSourceError, FencedError, ReclockError, TransientError
from reclock.stamp import UNBOUND, Stamper
from reclock.time import Frontier, decode_partition, encode_partition

__all__ = [
    "UNBOUND",
    "Bindings",
    "ConfigError",
    "DefiniteSourceError",
    "FencedError",
    "Frontier",
    "ReclockError",
    "Stamper",
    "TransientError",
    "decode_partition",
    "encode_partition",
]

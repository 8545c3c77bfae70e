"""What a decoder returns: the rows that decoded, and a fault for every value that did not.

Every input index is in exactly one of :attr:`Decoded.good` and :attr:`Decoded.errors`, so a bad
value never vanishes: the reader turns its fault into an :data:`~reclock.sources.base.ERRORS` row with
the value's coordinates.
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa

__all__ = ["DECODE", "NO_ROWS", "Decoded", "RecordFault", "all_good", "empty_batch"]

#: ``(input index, kind, message)`` of a value that could not be decoded.
RecordFault: TypeAlias = tuple[int, str, str]

#: ``kind`` of every decoding fault (the message says what was wrong).
DECODE = "decode"

#: ``Decoded.good`` when no value decoded.
NO_ROWS = np.zeros(0, dtype=np.int64)


class Decoded(NamedTuple):
    """Result of :meth:`~reclock.sources.decode.Decoder.decode`: ``batch`` row ``i`` is input value ``good[i]``."""

    batch: pa.RecordBatch
    good: np.ndarray
    errors: list[RecordFault]


def all_good(batch: pa.RecordBatch) -> Decoded:
    """Every value decoded, in input order."""
    return Decoded(batch, np.arange(batch.num_rows, dtype=np.int64), [])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of ``schema`` with no rows."""
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)

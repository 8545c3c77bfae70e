"""What a reader yields besides an output's own columns: lineage, and the rows of ``_errors``.

Every batch :meth:`~reclock.sources.base.Source.read` yields carries :data:`LINEAGE_FIELDS`
(``_partition``, ``_offset``) next to the output's columns. A record that cannot be decoded is not
an exception: the reader yields it to :data:`ERRORS` at its coordinates (:func:`error_batch`), so it
is never silently lost, or raises :class:`RecordError` when the pipeline's ``on_record_error``
policy says ``fail``. The bottom of the source contract: :mod:`reclock.sources.base` re-exports
every name here, which is where source authors import them from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import pyarrow as pa

from reclock.errors import ConfigError, ReclockError
from reclock.timeline.frontier import OFFSET, PARTITION, Offset

__all__ = [
    "ERRORS",
    "ERRORS_SCHEMA",
    "LINEAGE_FIELDS",
    "MAX_MESSAGE",
    "RECORD_ERROR_POLICIES",
    "RecordError",
    "RecordErrorPolicy",
    "check_record_error_policy",
    "clip_message",
    "debezium_schema",
    "error_batch",
]

#: What the pipeline does with a record that cannot be decoded: land it in :data:`ERRORS` at its
#: coordinates (``skip``), or fail the batch at the first one (``fail``, :class:`RecordError`).
RecordErrorPolicy = Literal["skip", "fail"]
RECORD_ERROR_POLICIES: tuple[RecordErrorPolicy, ...] = get_args(RecordErrorPolicy)

#: Output name of the errors table every pipeline has; readers yield bad records to it.
ERRORS = "_errors"

#: Columns every batch from :meth:`Source.read` carries besides the output's own.
LINEAGE_FIELDS = (pa.field(PARTITION, pa.string(), nullable=False), pa.field(OFFSET, pa.int64(), nullable=False))

#: Longest ``message`` a reader writes to :data:`ERRORS`: a problem quoting a huge value stays readable.
MAX_MESSAGE = 500

ERRORS_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("message", pa.string()),
        pa.field("raw", pa.binary()),
    ]
)


class RecordError(ReclockError):
    """A record could not be decoded and the pipeline asked to fail the batch."""


def check_record_error_policy(value: object, field: str = "on_record_error") -> RecordErrorPolicy:
    """``value`` as a :data:`RecordErrorPolicy`; a :class:`ConfigError` on ``field`` otherwise."""
    if value not in RECORD_ERROR_POLICIES:
        raise ConfigError(field, f"must be one of {', '.join(RECORD_ERROR_POLICIES)}, got {value!r}")
    return value


def debezium_schema(own: pa.Schema) -> pa.Schema:
    """The columns a ``debezium`` output's batches carry: the row before and after, and the op."""
    row = pa.struct(list(own))
    return pa.schema([pa.field("before", row), pa.field("after", row), pa.field("op", pa.string())])


def error_batch(
    partition: str | pa.Array,
    offsets: Sequence[Offset],
    kinds: Sequence[str],
    messages: Sequence[str],
    raws: Sequence[bytes | None],
) -> pa.RecordBatch:
    """The one builder of :data:`ERRORS` rows: lineage, then ``kind``, ``message`` and ``raw``.

    ``partition`` is already encoded: one string for every row (a reader's split), or a string
    array with one per row. Every record a reader rejects becomes such a row, at its own
    coordinates, so it is counted exactly once and never silently lost.
    """
    n = len(offsets)
    partitions = pa.array([partition] * n, pa.string()) if isinstance(partition, str) else partition
    return pa.RecordBatch.from_arrays(
        [
            partitions,
            pa.array(offsets, pa.int64()),
            pa.array(kinds, pa.string()),
            pa.array(messages, pa.string()),
            pa.array(raws, pa.binary()),
        ],
        schema=pa.schema([*LINEAGE_FIELDS, *ERRORS_SCHEMA]),
    )


def clip_message(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE` characters (ending in ``...`` when cut)."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."

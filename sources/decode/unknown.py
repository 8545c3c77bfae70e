"""Unknown fields: what a value carries beyond its output's columns, kept for schema evolution.

A decoder asked to keep them (``Decoder.unknown_fields``) adds one string column,
:data:`~reclock.timeline.frontier.UNKNOWN_FIELDS`, to its batch: per decoded value, the fields its output's
schema does not have, as one JSON object, or null when there are none (and for a tombstone).
The runtime then adds them as columns, rescues them, or stops, as the output's policy says
(:mod:`reclock.persist.evolution`). Which fields are "unknown" depends on the value alone, so a
replay decodes the same column.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from reclock.sources.decode.result import Decoded
from reclock.timeline.frontier import UNKNOWN_FIELDS

__all__ = ["UNKNOWN_FIELD", "unknown_column", "with_unknown_json"]

#: The staged column's field.
UNKNOWN_FIELD = pa.field(UNKNOWN_FIELDS, pa.string())


def unknown_column(objects: Iterable[Mapping[str, Any] | None], known: Sequence[str]) -> pa.Array:
    """Per object, its keys outside ``known`` as compact JSON (``None`` when it has none)."""
    names = frozenset(known)
    out = []
    for obj in objects:
        extra = {k: v for k, v in obj.items() if k not in names} if obj else None
        out.append(json.dumps(extra, separators=(",", ":"), ensure_ascii=False, default=str) if extra else None)
    return pa.array(out, pa.string())


def with_unknown_json(decoded: Decoded, values: Sequence[bytes | None], known: Sequence[str]) -> Decoded:
    """``decoded`` with the unknown-fields column of its good JSON values (one ``json.loads`` each)."""
    objects = (None if (value := values[int(i)]) is None else json.loads(value) for i in decoded.good)
    column = unknown_column(objects, known)
    batch = decoded.batch.append_column(UNKNOWN_FIELD, column)
    return Decoded(batch, decoded.good, decoded.errors)

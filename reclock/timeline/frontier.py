"""Source time: partitions, offsets and frontiers.

A *FromTime* is a source's own coordinate ``(partition, offset)``. A :class:`Frontier` (a source
*upper*) maps each partition to the first offset that is **not yet** complete: record ``(p, o)`` is
complete at ``F`` iff ``o < F.offset(p)``. A partition the frontier does not name is at offset 0,
so partitions that appear later never hold a frontier back and are never skipped (Materialize's
trailing range at offset 0). The *closed* frontier belongs to a finished source: everything is
complete at it and it lies above every other frontier.

Frontiers are partially ordered pointwise and form a lattice under :meth:`Frontier.join` (max)
and :meth:`Frontier.meet` (min); the closed frontier is the top, the empty one the bottom.

Partition ids are hashable values; those that reach a Delta table must be ``int``, ``str`` or
tuples of them, or a :class:`Reread` of one, which :func:`encode_partition` turns into one
canonical string.

*Into time* is milliseconds since the epoch (:func:`wall_clock_ms` is the default clock). An
output whose newest commit is labelled with binding time ``T`` holds every row with
``_into_ts <= T``, so its *upper* is ``T + 1`` (:func:`label_upper`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "INTO_TS",
    "UNKNOWN_FIELDS",
    "MAX_OFFSET",
    "OFFSET",
    "PARTITION",
    "Frontier",
    "IntoTime",
    "Offset",
    "Partition",
    "Reread",
    "cap_frontier",
    "decode_partition",
    "encode_partition",
    "label_upper",
    "wall_clock_ms",
]

Partition: TypeAlias = Hashable
Offset: TypeAlias = int
IntoTime: TypeAlias = int

#: The columns every output row carries: its into time, and its from time (encoded partition, offset).
INTO_TS = "_into_ts"
PARTITION = "_partition"
OFFSET = "_offset"
#: A staged column a source adds when asked to keep unknown fields: each record's fields its
#: output does not declare, as one JSON object (null when none). Never a table column.
UNKNOWN_FIELDS = "_unknown_fields"

#: The offset a closed frontier reports for every partition: above any int64 source offset.
MAX_OFFSET: Offset = 2**63 - 1


def wall_clock_ms() -> IntoTime:
    """Now, as an into time: the timeline's default clock."""
    return int(time.time() * 1000)


def label_upper(label: IntoTime | None) -> IntoTime:
    """The into-time upper of an output whose newest commit label is ``label`` (0 before any)."""
    return 0 if label is None else label + 1


class Frontier:
    """An immutable map ``partition -> first offset not yet complete``; a hashable value."""

    __slots__ = ("_closed", "_hash", "_offsets")

    def __init__(self, offsets: Mapping[Partition, Offset] | None = None) -> None:
        items = {}
        for partition, offset in (offsets or {}).items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset for partition {partition!r} must be an int >= 0, got {offset!r}")
            if offset:
                items[partition] = int(offset)
        self._offsets: dict[Partition, Offset] = items
        self._closed = False
        self._hash: int | None = None

    @classmethod
    def closed(cls) -> Frontier:
        """The frontier of a finished source: every record is complete at it."""
        frontier = cls()
        frontier._closed = True
        return frontier

    @property
    def is_closed(self) -> bool:
        return self._closed

    def offset(self, partition: Partition) -> Offset:
        """First offset of ``partition`` not complete at this frontier (0 if not named)."""
        if self._closed:
            return MAX_OFFSET
        return self._offsets.get(partition, 0)

    def covers(self, partition: Partition, offset: Offset) -> bool:
        """Whether record ``(partition, offset)`` is complete at this frontier."""
        return self._closed or offset < self._offsets.get(partition, 0)

    def partitions(self) -> Iterator[Partition]:
        """The partitions named with a non-zero offset (none for a closed frontier)."""
        return iter(self._offsets)

    def items(self) -> Iterator[tuple[Partition, Offset]]:
        return iter(self._offsets.items())

    def less_equal(self, other: Frontier) -> bool:
        """Pointwise ``self <= other``: everything complete here is complete at ``other``."""
        if other._closed:
            return True
        if self._closed:
            return False
        return all(offset <= other._offsets.get(p, 0) for p, offset in self._offsets.items())

    def join(self, other: Frontier) -> Frontier:
        """Pointwise maximum: the least frontier at or above both."""
        if self._closed or other._closed:
            return Frontier.closed()
        merged = dict(self._offsets)
        for p, offset in other._offsets.items():
            if offset > merged.get(p, 0):
                merged[p] = offset
        return Frontier(merged)

    def meet(self, other: Frontier) -> Frontier:
        """Pointwise minimum: the greatest frontier at or below both."""
        if self._closed:
            return other
        if other._closed:
            return self
        return Frontier({p: min(o, other._offsets.get(p, 0)) for p, o in self._offsets.items()})

    def count_to(self, upper: Frontier) -> int:
        """Number of offsets between this frontier and a finite ``upper`` above it."""
        if upper._closed:
            raise ValueError("cannot count offsets up to a closed frontier")
        return sum(max(0, o - self._offsets.get(p, 0)) for p, o in upper._offsets.items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frontier):
            return NotImplemented
        return self._closed == other._closed and self._offsets == other._offsets

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._closed, frozenset(self._offsets.items())))
        return self._hash

    def __repr__(self) -> str:
        if self._closed:
            return "Frontier.closed()"
        return f"Frontier({self._offsets!r})"

    def __reduce__(self) -> tuple[object, ...]:
        if self._closed:
            return (Frontier.closed, ())
        return (Frontier, (self._offsets,))

    def to_json(self) -> str:
        """Canonical JSON (partitions encoded, sorted) for configs, logs and status tables."""
        if self._closed:
            return json.dumps({"closed": True})
        encoded = sorted((encode_partition(p), o) for p, o in self._offsets.items())
        return json.dumps({"offsets": dict(encoded)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Frontier:
        data = json.loads(text)
        if data.get("closed"):
            return cls.closed()
        return cls({decode_partition(p): o for p, o in data.get("offsets", {}).items()})


#: How the last element of a re-read partition's encoding begins: ``["orders",3,"@reread-1"]`` is
#: the first re-read of Kafka partition ``("orders", 3)``. The persisted form only, read back by
#: :func:`decode_partition` (a tuple that ends so is reserved for it).
_REREAD = "@reread-"


@dataclass(frozen=True, order=True)
class Reread:
    """The partition a re-read of ``of`` lands under: the same records again, under their own identity.

    A re-read loads records a second time, so they need an identity of their own, as a dropped
    file gets a new generation: the lineage says which copy a row is, and the bindings of the
    original partition are untouched. A re-read partition is bound once, to a fixed end, by
    ``reclock set-offsets``; no probe ever names it. A source reads its offsets from ``of``.
    """

    of: Partition
    generation: int

    def __post_init__(self) -> None:
        if isinstance(self.of, Reread) or not isinstance(self.generation, int) or self.generation < 1:
            raise ValueError(f"a re-read copies a source partition, generation >= 1; got {self!r}")


def encode_partition(partition: Partition) -> str:
    """Canonical, reversible string for a partition id, readable for plain names.

    ``"gen-0" -> gen-0``, ``3 -> 3``, ``("orders", 3) -> ["orders",3]``; a string that would read
    back as something else (``"12"``, ``"[x"``) is JSON-quoted. A :class:`Reread` is its original's
    coordinates followed by ``"@reread-<generation>"`` (``["orders",3,"@reread-1"]``), the form
    remap tables have always stored: a source's own tuple must not end like that, or it reads back
    as a re-read.
    """
    if isinstance(partition, Reread):
        base = partition.of if isinstance(partition.of, tuple) else (partition.of,)
        return _encode_tuple((*base, f"{_REREAD}{partition.generation}"), partition)
    if isinstance(partition, bool):
        raise TypeError(f"partition id must be int, str or a tuple of them, got {partition!r}")
    if isinstance(partition, int):
        return str(partition)
    if isinstance(partition, str):
        if partition and partition[0] not in '["' and not _looks_like_int(partition):
            return partition
        return json.dumps(partition)
    if isinstance(partition, tuple):
        return _encode_tuple(partition, partition)
    raise TypeError(f"partition id must be int, str or a tuple of them, got {partition!r}")


def _encode_tuple(elements: tuple, partition: Partition) -> str:
    if not all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in elements):
        raise TypeError(f"partition id must be int, str or a tuple of them, got {partition!r}")
    return json.dumps(list(elements), separators=(",", ":"))


def decode_partition(text: str) -> Partition:
    """Inverse of :func:`encode_partition`; the one place a re-read's persisted form is parsed."""
    if text.startswith("["):
        elements = tuple(json.loads(text))
        return _as_reread(elements) or elements
    if text.startswith('"'):
        return json.loads(text)
    if _looks_like_int(text):
        return int(text)
    return text


def _as_reread(elements: tuple) -> Reread | None:
    """The :class:`Reread` whose encoding has these elements: coordinates, then ``@reread-<n>``."""
    if len(elements) < 2 or not isinstance(elements[-1], str) or not elements[-1].startswith(_REREAD):
        return None
    generation = elements[-1][len(_REREAD) :]
    if not generation.isdigit() or not generation.isascii() or int(generation) < 1:
        return None
    base = elements[:-1]
    return Reread(base[0] if len(base) == 1 else base, int(generation))


def _looks_like_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def cap_frontier(lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
    """Water-fill ``max_records`` over the partitions between ``lower`` and ``upper``.

    Each lagging partition gets an equal share; what a short partition leaves over goes to the
    others, so the cap is reached whenever there is enough data and no partition starves.
    """
    lags = {p: o - lower.offset(p) for p, o in upper.items() if o > lower.offset(p)}
    if sum(lags.values()) <= max_records:
        return upper
    grant: dict[Partition, int] = {}
    budget = max_records
    pending = sorted(lags.items(), key=lambda item: item[1])
    while pending:
        share = budget // len(pending)
        p, lag = pending[0]
        if lag <= share:
            grant[p] = lag
            budget -= lag
            pending.pop(0)
            continue
        for i, (p, _) in enumerate(pending):
            grant[p] = share + (1 if i < budget - share * len(pending) else 0)
        break
    return lower.join(Frontier({p: lower.offset(p) + g for p, g in grant.items()}))

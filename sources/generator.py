"""A deterministic load generator: an auction workload shaped like Nexmark.

The generator is reclock's embedded source for demos, tests and benchmarks. It has ``partitions``
partitions named ``gen-0``, ``gen-1``, ... and three outputs (subsources): ``persons``,
``auctions`` and ``bids``. Offset ``o`` of a partition is one event; its kind follows Nexmark's
1:3:46 mix: ``o % 50 == 0`` is a person, ``o % 50`` in ``1..3`` an auction, anything else a bid.

Contract, and why each part matters to exactly-once ingestion:

* **Deterministic.** Every value of record ``(p, o)`` is a pure function of ``(seed, partitions,
  p, o)``: a splitmix64 hash of those coordinates indexes small tables of names and prices. It
  never depends on the clock, ``rate``, ``anchor_ms`` or the process, so a benchmark run can be
  checked against a re-computation, and two runs with one seed land identical tables.
* **Replayable.** :meth:`GeneratorSource.read` of a split returns the same rows every time, in any
  process: a batch that failed after writing half its outputs is retried with the very records
  the surviving half was stamped from. Prices use integer arithmetic only, because a float
  ``pow`` may differ by an ulp between numpy builds, and a replay must be bit-exact.
* **Split-additive.** Reading ``[a, b)`` then ``[b, c)`` yields exactly the rows of ``[a, c)``,
  whatever the cut, since no value depends on where a split or a chunk starts. Resumption cuts
  splits at arbitrary frontiers; additivity is what makes the resumed table equal an
  uninterrupted one.

Time enters only through :meth:`GeneratorSource.upper`: with a ``rate`` the data *exists* from
``anchor_ms`` on at ``rate`` events per second (shared evenly by the partitions), with a ``limit``
it stops there. ``upper`` is a monotone function of the injected clock, so it never regresses
while the clock does not.

Persons and auctions get ids unique across partitions (``1000 + local_index * partitions +
partition_index``). A bid or an auction only refers to persons and auctions that come *earlier in
its own partition*, with a skew towards recent ones (Nexmark's hot sellers, bidders and auctions),
so referential integrity holds for every prefix of a partition.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import ConfigError
from reclock.sources.base import LINEAGE_FIELDS, Output, SettableOffsets, SourceBase, SourceContext, Split
from reclock.timeline.frontier import Frontier, encode_partition

__all__ = [
    "AUCTIONS",
    "AUCTIONS_SCHEMA",
    "BIDS",
    "BIDS_SCHEMA",
    "BASE_EPOCH_MS",
    "FIRST_ID",
    "PERSONS",
    "PERSONS_SCHEMA",
    "GeneratorSource",
]

PERSONS = "persons"
AUCTIONS = "auctions"
BIDS = "bids"

PERSONS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("email", pa.string()),
        pa.field("city", pa.string()),
        pa.field("state", pa.string()),
        pa.field("date_time", pa.int64()),
    ]
)
AUCTIONS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("seller", pa.int64()),
        pa.field("category", pa.int64()),
        pa.field("initial_bid", pa.int64()),
        pa.field("reserve", pa.int64()),
        pa.field("expires", pa.int64()),
        pa.field("item_name", pa.string()),
        pa.field("date_time", pa.int64()),
    ]
)
BIDS_SCHEMA = pa.schema(
    [
        pa.field("auction", pa.int64()),
        pa.field("bidder", pa.int64()),
        pa.field("price", pa.int64()),
        pa.field("channel", pa.string()),
        pa.field("date_time", pa.int64()),
    ]
)

_BATCH_SCHEMAS = {
    name: pa.schema([*LINEAGE_FIELDS, *schema])
    for name, schema in ((PERSONS, PERSONS_SCHEMA), (AUCTIONS, AUCTIONS_SCHEMA), (BIDS, BIDS_SCHEMA))
}

#: Event time (ms) of offset 0; offset ``o`` happened at ``BASE_EPOCH_MS + 10 * o``.
BASE_EPOCH_MS = 1_700_000_000_000
#: Smallest person and auction id, as in Nexmark.
FIRST_ID = 1000

_EVENT_STEP_MS = 10
#: Nexmark's proportions: out of every 50 events, 1 person, 3 auctions, 46 bids.
_EVENTS_PER_CYCLE = 50
_AUCTIONS_PER_CYCLE = 3
#: Offsets generated at once; bounds memory per task whatever the split size.
_CHUNK_OFFSETS = 65_536
#: How many of the most recent persons/auctions count as "hot"; 3 picks in 4 go to them.
_HOT_WINDOW = 100
_FIRST_CATEGORY = 10
_CATEGORIES = 5
_MIN_AUCTION_MS = 60_000
_AUCTION_SPAN_MS = 600_000

_FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
_LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
_CITIES = (
    ("Phoenix", "AZ"),
    ("Los Angeles", "CA"),
    ("San Francisco", "CA"),
    ("Boise", "ID"),
    ("Portland", "OR"),
    ("Bend", "OR"),
    ("Redmond", "OR"),
    ("Seattle", "WA"),
    ("Kent", "WA"),
    ("Cheyenne", "WY"),
)
_DOMAINS = ("example.com", "example.org", "example.net", "mail.test")
_ADJECTIVES = ("Antique", "Vintage", "Rare", "Signed", "Mint", "Used", "Handmade", "Limited", "Classic", "Tiny")
_NOUNS = ("Lamp", "Clock", "Guitar", "Bicycle", "Camera", "Teapot", "Globe", "Typewriter", "Vase", "Radio")
_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

_FIRST_NAME_ARRAY = pa.array(_FIRST_NAMES, pa.string())
_FIRST_NAME_LOWER = pa.array([n.lower() for n in _FIRST_NAMES], pa.string())
_LAST_NAME_ARRAY = pa.array(_LAST_NAMES, pa.string())
_LAST_NAME_LOWER = pa.array([n.lower() for n in _LAST_NAMES], pa.string())
_CITY_ARRAY = pa.array([c for c, _ in _CITIES], pa.string())
_STATE_ARRAY = pa.array([s for _, s in _CITIES], pa.string())
_DOMAIN_ARRAY = pa.array(_DOMAINS, pa.string())
_ADJECTIVE_ARRAY = pa.array(_ADJECTIVES, pa.string())
_NOUN_ARRAY = pa.array(_NOUNS, pa.string())
_CHANNEL_ARRAY = pa.array(_CHANNELS, pa.string())
_TWO_TO_MINUS_53 = 2.0**-53
_POW10 = np.array([10**e for e in range(6)], dtype=np.uint64)

# splitmix64 constants (Steele, Lea & Flood 2014).
_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
# One salt per hash stream. A stream feeds either one pick (which uses all 64 bits) or fields that
# use disjoint bit ranges, so no two fields of a record are correlated.
(
    _STREAM_PERSON,
    _STREAM_AUCTION_SELLER,
    _STREAM_AUCTION_PRICE,
    _STREAM_AUCTION_RESERVE,
    _STREAM_AUCTION_ITEM,
    _STREAM_BID_AUCTION,
    _STREAM_BID_BIDDER,
    _STREAM_BID_PRICE,
) = range(1, 9)


def _wall_clock_ms() -> int:
    """The default clock: wall time in ms since the epoch (only the driver's ``upper`` reads it)."""
    return int(time.time() * 1000)


def _mix_int(z: int) -> int:
    """splitmix64's finaliser on a Python int; the scalar twin of :func:`_mix`."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _MUL1) & _MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & _MASK64
    return z ^ (z >> 31)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic), in place where it can be."""
    z = z ^ (z >> np.uint64(30))
    z *= np.uint64(_MUL1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MUL2)
    z ^= z >> np.uint64(31)
    return z


def _pick(h: np.ndarray, count: np.ndarray) -> np.ndarray:
    """A local index in ``[0, count)``: 3 in 4 among the last :data:`_HOT_WINDOW`, else uniform.

    The skew makes joins and aggregations look like Nexmark's (a few hot auctions take most bids)
    while every pick still names an entity that already exists.
    """
    # A uniform fraction from the top 53 bits scales to any count with one float multiply: exact
    # IEEE arithmetic (no transcendental functions), so as bit-exact as integers, and much faster
    # than a uint64 modulo by an array.
    fraction = (h >> np.uint64(11)).astype(np.float64) * _TWO_TO_MINUS_53
    total = count.astype(np.float64)
    hot = total - 1.0 - np.floor(fraction * np.minimum(total, float(_HOT_WINDOW)))
    uniform = np.floor(fraction * total)
    return np.where((h & np.uint64(3)) != 0, hot, uniform).astype(np.uint64)


def _price(h: np.ndarray) -> np.ndarray:
    """A price in cents from bits 0-47 of ``h``: log-uniform by decade from 1.00 to 999,000.00.

    Integer arithmetic only: Nexmark's ``10 ** (6 * random)`` needs a float ``pow`` whose last bit
    may differ between numpy builds, and a replayed record must be bit-identical.
    """
    mantissa = np.uint64(100) + (h & np.uint64(0xFFFFFFFF)) % np.uint64(900)
    return (mantissa * _POW10[_index(h, 32, len(_POW10))]).astype(np.int64)


def _index(h: np.ndarray, shift: int, size: int) -> np.ndarray:
    """An index into a table of ``size`` entries from 16 bits of ``h`` starting at ``shift``."""
    return ((h >> np.uint64(shift)) & np.uint64(0xFFFF)) % np.uint64(size)


def _take(table: pa.Array, indices: np.ndarray) -> pa.Array:
    return pc.take(table, pa.array(indices.astype(np.int64)))


def _check_int(field: str, value: object, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(field, f"must be >= {minimum}, got {value!r}")
    return value


class GeneratorSource(SourceBase, SettableOffsets):
    """Nexmark-like persons, auctions and bids that appear at ``rate`` and stop at ``limit``.

    A plain, picklable value: the reader half (:meth:`read`) needs no clock and no state, so a
    Spark task can rebuild any split from the source object alone. An offset is one event, so
    offsets are settable (it never re-reads: a re-read partition would generate other events).
    """

    def __init__(
        self,
        *,
        partitions: int = 4,
        rate: float | None = None,
        limit: int | None = None,
        seed: int = 0,
        anchor_ms: int = 0,
        now: Callable[[], int] | None = None,
        max_split_offsets: int = 1_000_000,
    ) -> None:
        """Validate the settings eagerly, so a bad pipeline fails at definition, naming the field.

        ``rate`` counts events per second over all partitions from ``anchor_ms`` (an into-time)
        on; ``None`` means everything up to ``limit`` exists at once. ``limit`` is the total
        number of events and makes the source bounded. Without either the generator would claim
        infinitely many records at once, which no pipeline can ingest, so that is an error.
        """
        self.partitions = _check_int("partitions", partitions, minimum=1)
        if rate is not None:
            if isinstance(rate, bool) or not isinstance(rate, (int, float)):
                raise ConfigError("rate", f"must be a number of events per second, got {rate!r}")
            if not math.isfinite(rate) or rate <= 0:
                raise ConfigError("rate", f"must be a finite number > 0, got {rate!r}")
        self.rate = rate
        self.limit = None if limit is None else _check_int("limit", limit, minimum=0)
        if rate is None and limit is None:
            raise ConfigError("rate", "give a rate, a limit or both: an unlimited generator without a rate is infinite")
        self.seed = _check_int("seed", seed)
        self.anchor_ms = _check_int("anchor_ms", anchor_ms)
        self.max_split_offsets = _check_int("max_split_offsets", max_split_offsets, minimum=1)
        if now is not None and not callable(now):
            raise ConfigError("now", f"must be a callable returning ms since the epoch, got {now!r}")
        self._now: Callable[[], int] = now if now is not None else _wall_clock_ms
        self.partition_ids: tuple[str, ...] = tuple(f"gen-{i}" for i in range(self.partitions))
        self._index_of = {p: i for i, p in enumerate(self.partition_ids)}
        self.partition_limits: tuple[int, ...] | None = None
        if self.limit is not None:
            share, extra = divmod(self.limit, self.partitions)
            self.partition_limits = tuple(share + (1 if i < extra else 0) for i in range(self.partitions))
        # Exact decimal value of the rate, so e.g. 1000/s over 3 partitions reaches 1000 at 1 s.
        self._rate = None if rate is None else (Fraction(rate) if isinstance(rate, int) else Fraction(repr(rate)))
        seed_key = _mix_int(self.seed + _GAMMA)
        self._keys = tuple(_mix_int(seed_key ^ _mix_int((i + 1) * _GAMMA)) for i in range(self.partitions))

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> GeneratorSource:
        """The pipeline's generator: its rate counts from when the pipeline was created
        (``anchor_ms``), so a restarted job finds the events it had already bound."""
        return cls(**{"anchor_ms": context.created_at_ms, **options})

    def __repr__(self) -> str:
        return (
            f"GeneratorSource(partitions={self.partitions}, rate={self.rate!r}, limit={self.limit!r}, "
            f"seed={self.seed}, anchor_ms={self.anchor_ms})"
        )

    # -- pickling: the clock stays on the driver -------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Drop the clock: tasks never probe, and a test's lambda clock cannot be pickled."""
        state = dict(self.__dict__)
        del state["_now"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore with the wall clock, so an unpickled copy can still answer :meth:`upper`."""
        self.__dict__.update(state)
        self._now = _wall_clock_ms

    # -- the driver side ---------------------------------------------------------------------------

    def outputs(self) -> Sequence[Output]:
        """The three subsources; persons and auctions are keyed by their globally unique ``id``."""
        return (
            Output(PERSONS, PERSONS_SCHEMA, key=("id",)),
            Output(AUCTIONS, AUCTIONS_SCHEMA, key=("id",)),
            Output(BIDS, BIDS_SCHEMA),
        )

    def upper(self) -> Frontier:
        """The probe: per partition, the events due by now at the rate, capped at the limit.

        Computed exactly (rational arithmetic, floor) from ``now() - anchor_ms`` clamped at 0, so
        it is monotone in the clock: a non-decreasing clock never makes the frontier regress.
        """
        if self._rate is None:
            assert self.partition_limits is not None, "validated in __init__: rate or limit is set"
            return Frontier(dict(zip(self.partition_ids, self.partition_limits, strict=True)))
        elapsed_ms = max(0, int(self._now()) - self.anchor_ms)
        due = int(self._rate * elapsed_ms // (1000 * self.partitions))
        if self.partition_limits is None:
            return Frontier(dict.fromkeys(self.partition_ids, due))
        return Frontier({p: min(due, cap) for p, cap in zip(self.partition_ids, self.partition_limits, strict=True)})

    def end(self) -> Frontier | None:
        """With a ``limit`` the final frontier is known from the start; without one there is none."""
        if self.partition_limits is None:
            return None
        return Frontier(dict(zip(self.partition_ids, self.partition_limits, strict=True)))

    # -- the task side -----------------------------------------------------------------------------

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Rebuild offsets ``[split.start, split.end)`` of one partition, chunk by chunk.

        Yields per chunk of at most 65,536 offsets one batch per output that has rows in it
        (persons, auctions, bids in that order); no batch is empty. Values depend only on the
        offset, never on the chunking, which is what makes splits additive.
        """
        index = self._index_of.get(split.partition) if isinstance(split.partition, str) else None
        if index is None:
            raise ValueError(f"generator has no partition {split.partition!r}; it has {list(self.partition_ids)}")
        if not 0 <= split.start <= split.end:
            raise ValueError(f"split of {split.partition!r} has bad range [{split.start}, {split.end})")
        if self.partition_limits is not None and split.end > self.partition_limits[index]:
            raise ValueError(
                f"split of {split.partition!r} ends at {split.end}, past the partition's limit "
                f"{self.partition_limits[index]}"
            )
        encoded = encode_partition(split.partition)
        for start in range(split.start, split.end, _CHUNK_OFFSETS):
            stop = min(split.end, start + _CHUNK_OFFSETS)
            yield from self._chunk(index, encoded, start, stop)

    def _chunk(self, index: int, encoded: str, start: int, stop: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        offsets = np.arange(start, stop, dtype=np.uint64)
        kind = offsets % np.uint64(_EVENTS_PER_CYCLE)
        is_person = kind == 0
        is_auction = (kind >= 1) & (kind <= _AUCTIONS_PER_CYCLE)
        is_bid = kind > _AUCTIONS_PER_CYCLE
        for name, mask, build in (
            (PERSONS, is_person, self._persons),
            (AUCTIONS, is_auction, self._auctions),
            (BIDS, is_bid, self._bids),
        ):
            selected = offsets[mask]
            if len(selected) == 0:
                continue
            columns = build(index, selected)
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(encoded, pa.string()), len(selected)),
                    pa.array(selected.astype(np.int64), pa.int64()),
                    *columns,
                ],
                schema=_BATCH_SCHEMAS[name],
            )
            yield name, batch

    def _hash(self, index: int, offsets: np.ndarray, stream: int) -> np.ndarray:
        """Independent 64-bit hash of ``(seed, partition, offset)`` for one named stream."""
        state = offsets * np.uint64(_GAMMA)
        state += np.uint64((self._keys[index] + stream * _MUL2) & _MASK64)
        return _mix(state)

    def _global_id(self, index: int, local: np.ndarray) -> np.ndarray:
        """Interleave partitions' local sequences into one dense id space: unique across them."""
        return (np.uint64(FIRST_ID) + local * np.uint64(self.partitions) + np.uint64(index)).astype(np.int64)

    @staticmethod
    def _date_time(offsets: np.ndarray) -> np.ndarray:
        return (offsets.astype(np.int64) * _EVENT_STEP_MS) + BASE_EPOCH_MS

    def _persons(self, index: int, offsets: np.ndarray) -> list[pa.Array]:
        ids = self._global_id(index, offsets // np.uint64(_EVENTS_PER_CYCLE))
        h = self._hash(index, offsets, _STREAM_PERSON)
        first, last = _index(h, 0, len(_FIRST_NAMES)), _index(h, 16, len(_LAST_NAMES))
        city, domain = _index(h, 32, len(_CITIES)), _index(h, 48, len(_DOMAINS))
        email_user = pc.binary_join_element_wise(
            _take(_FIRST_NAME_LOWER, first), _take(_LAST_NAME_LOWER, last), pc.cast(pa.array(ids), pa.string()), "."
        )
        return [
            pa.array(ids),
            pc.binary_join_element_wise(_take(_FIRST_NAME_ARRAY, first), _take(_LAST_NAME_ARRAY, last), " "),
            pc.binary_join_element_wise(email_user, _take(_DOMAIN_ARRAY, domain), "@"),
            _take(_CITY_ARRAY, city),
            _take(_STATE_ARRAY, city),
            pa.array(self._date_time(offsets)),
        ]

    def _auctions(self, index: int, offsets: np.ndarray) -> list[pa.Array]:
        cycle = offsets // np.uint64(_EVENTS_PER_CYCLE)
        slot = offsets % np.uint64(_EVENTS_PER_CYCLE) - np.uint64(1)
        ids = self._global_id(index, cycle * np.uint64(_AUCTIONS_PER_CYCLE) + slot)
        # The person of this cycle sits at offset cycle * 50 < o, so cycle + 1 persons exist.
        seller = self._global_id(index, _pick(self._hash(index, offsets, _STREAM_AUCTION_SELLER), cycle + np.uint64(1)))
        price_hash = self._hash(index, offsets, _STREAM_AUCTION_PRICE)
        initial_bid = _price(price_hash)
        category = _FIRST_CATEGORY + _index(price_hash, 48, _CATEGORIES).astype(np.int64)
        reserve = initial_bid + _price(self._hash(index, offsets, _STREAM_AUCTION_RESERVE))
        item_hash = self._hash(index, offsets, _STREAM_AUCTION_ITEM)
        date_time = self._date_time(offsets)
        lifetime = ((item_hash & np.uint64(0xFFFFFFFF)) % np.uint64(_AUCTION_SPAN_MS)).astype(np.int64)
        item_name = pc.binary_join_element_wise(
            _take(_ADJECTIVE_ARRAY, _index(item_hash, 32, len(_ADJECTIVES))),
            _take(_NOUN_ARRAY, _index(item_hash, 48, len(_NOUNS))),
            " ",
        )
        return [
            pa.array(ids),
            pa.array(seller),
            pa.array(category),
            pa.array(initial_bid),
            pa.array(reserve),
            pa.array(date_time + _MIN_AUCTION_MS + lifetime),
            item_name,
            pa.array(date_time),
        ]

    def _bids(self, index: int, offsets: np.ndarray) -> list[pa.Array]:
        cycle_plus_one = offsets // np.uint64(_EVENTS_PER_CYCLE) + np.uint64(1)
        # A bid's offset is past its cycle's person and three auctions, so all of them exist.
        auction_hash = self._hash(index, offsets, _STREAM_BID_AUCTION)
        auction = self._global_id(index, _pick(auction_hash, cycle_plus_one * np.uint64(_AUCTIONS_PER_CYCLE)))
        bidder = self._global_id(index, _pick(self._hash(index, offsets, _STREAM_BID_BIDDER), cycle_plus_one))
        price_hash = self._hash(index, offsets, _STREAM_BID_PRICE)
        return [
            pa.array(auction),
            pa.array(bidder),
            pa.array(_price(price_hash)),
            _take(_CHANNEL_ARRAY, _index(price_hash, 48, len(_CHANNELS))),
            pa.array(self._date_time(offsets)),
        ]

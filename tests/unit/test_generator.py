"""The load generator's contract: deterministic, replayable, split-additive, and honest about time."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from collections.abc import Iterable
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reclock.sources.generator as generator
from reclock.errors import ConfigError
from reclock.sources.base import LINEAGE_FIELDS, Source, Split
from reclock.sources.generator import AUCTIONS, BASE_EPOCH_MS, BIDS, PERSONS, GeneratorSource
from reclock.timeline.frontier import Frontier

OUTPUTS = (PERSONS, AUCTIONS, BIDS)


def read_tables(source: GeneratorSource, splits: Iterable[Split]) -> dict[str, pa.Table]:
    """Every output's rows from ``splits``, in read order (empty tables for outputs with none)."""
    schemas = {o.name: pa.schema([*LINEAGE_FIELDS, *o.schema]) for o in source.outputs()}
    batches: dict[str, list[pa.RecordBatch]] = {name: [] for name in schemas}
    for split in splits:
        for name, batch in source.read(split):
            assert batch.schema == schemas[name]
            batches[name].append(batch)
    return {name: pa.Table.from_batches(batches[name], schema=schemas[name]) for name in schemas}


def read_rows(source: GeneratorSource, split: Split) -> dict[str, list[dict[str, Any]]]:
    return {name: table.to_pylist() for name, table in read_tables(source, [split]).items()}


class FakeClock:
    """A settable clock in ms, like ``reclock.testing``'s, kept local so this test stands alone."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_generator_is_a_source() -> None:
    assert isinstance(GeneratorSource(limit=10), Source)


def test_outputs_declare_only_their_own_columns() -> None:
    outputs = GeneratorSource(limit=10).outputs()
    assert [o.name for o in outputs] == list(OUTPUTS)
    for output in outputs:
        assert not {"_partition", "_offset"} & set(output.schema.names)
        for field in output.schema:
            assert field.type in (pa.int64(), pa.float64(), pa.string(), pa.bool_()), field


def test_every_batch_has_lineage_then_the_output_schema() -> None:
    source = GeneratorSource(partitions=2, limit=1_000)
    schemas = {o.name: o.schema for o in source.outputs()}
    seen = set()
    for name, batch in source.read(Split("gen-1", 0, 500)):
        assert batch.schema == pa.schema([*LINEAGE_FIELDS, *schemas[name]])
        assert batch.num_rows > 0
        assert set(batch.column("_partition").to_pylist()) == {"gen-1"}
        seen.add(name)
    assert seen == set(OUTPUTS)


def test_same_split_reads_identically_twice() -> None:
    source = GeneratorSource(partitions=3, limit=30_000, seed=7)
    split = Split("gen-2", 123, 9_876)
    assert read_tables(source, [split]) == read_tables(source, [split])


def test_a_fresh_source_with_the_same_seed_reads_the_same_rows() -> None:
    split = Split("gen-0", 0, 2_000)
    assert read_rows(GeneratorSource(limit=10_000, seed=3), split) == read_rows(
        GeneratorSource(limit=10_000, seed=3), split
    )


def test_a_different_seed_changes_the_data_but_not_the_ids() -> None:
    split = Split("gen-0", 0, 2_000)
    a = read_rows(GeneratorSource(limit=10_000, seed=1), split)
    b = read_rows(GeneratorSource(limit=10_000, seed=2), split)
    assert [r["id"] for r in a[PERSONS]] == [r["id"] for r in b[PERSONS]]
    assert [r["price"] for r in a[BIDS]] != [r["price"] for r in b[BIDS]]


def test_data_does_not_depend_on_rate_anchor_or_clock() -> None:
    split = Split("gen-1", 10, 3_000)
    bounded = GeneratorSource(limit=40_000, seed=5)
    paced = GeneratorSource(rate=12.5, seed=5, anchor_ms=1_234_567, now=lambda: 99)
    assert read_tables(bounded, [split]) == read_tables(paced, [split])


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 400),
    length=st.integers(0, 1_500),
    cuts=st.lists(st.integers(0, 1_500), max_size=6),
    chunk=st.integers(1, 300),
)
def test_adjacent_splits_concatenate_to_the_whole_range(start: int, length: int, cuts: list[int], chunk: int) -> None:
    source = GeneratorSource(partitions=2, rate=100.0, seed=11)
    end = start + length
    bounds = [start, *sorted(start + c for c in cuts if c <= length), end]
    pieces = [Split("gen-1", a, b) for a, b in itertools.pairwise(bounds)]
    whole = read_tables(source, [Split("gen-1", start, end)])
    # A small chunk size puts chunk boundaries inside the range too: they must not show either.
    with mock.patch.object(generator, "_CHUNK_OFFSETS", chunk):
        assert read_tables(source, pieces) == whole
        assert all(batch.num_rows <= chunk for piece in pieces for _, batch in source.read(piece))


def test_reads_cover_exactly_the_split_offsets_once() -> None:
    tables = read_tables(GeneratorSource(limit=10_000), [Split("gen-3", 37, 1_234)])
    offsets = sorted(o for t in tables.values() for o in t.column("_offset").to_pylist())
    assert offsets == list(range(37, 1_234))


def test_large_splits_are_read_in_bounded_chunks() -> None:
    source = GeneratorSource(partitions=1, limit=200_000)
    sizes = [batch.num_rows for _, batch in source.read(Split("gen-0", 0, 200_000))]
    assert max(sizes) <= 65_536
    assert sum(sizes) == 200_000


def test_rows_per_output_follow_the_1_3_46_mix() -> None:
    tables = read_tables(GeneratorSource(partitions=1, limit=5_000), [Split("gen-0", 0, 5_000)])
    assert {name: t.num_rows for name, t in tables.items()} == {PERSONS: 100, AUCTIONS: 300, BIDS: 4_600}
    kinds = {name: Counter(o % 50 for o in t.column("_offset").to_pylist()) for name, t in tables.items()}
    assert set(kinds[PERSONS]) == {0}
    assert set(kinds[AUCTIONS]) == {1, 2, 3}
    assert set(kinds[BIDS]) == set(range(4, 50))


def test_event_time_is_a_fixed_function_of_the_offset() -> None:
    tables = read_tables(GeneratorSource(limit=4_000, now=lambda: 5), [Split("gen-0", 0, 1_000)])
    for table in tables.values():
        for row in table.select(["_offset", "date_time"]).to_pylist():
            assert row["date_time"] == BASE_EPOCH_MS + 10 * row["_offset"]


def test_ids_are_unique_across_partitions() -> None:
    source = GeneratorSource(partitions=3, limit=30_000)
    tables = read_tables(source, source.splits(Frontier(), source.upper()))
    for name in (PERSONS, AUCTIONS):
        ids = tables[name].column("id").to_pylist()
        assert len(ids) == len(set(ids)), name
    assert tables[PERSONS].num_rows == 600
    assert tables[AUCTIONS].num_rows == 1_800


def test_bids_and_auctions_refer_to_entities_that_came_before() -> None:
    source = GeneratorSource(partitions=2, limit=20_000, seed=4)
    for partition in ("gen-0", "gen-1"):
        rows = read_rows(source, Split(partition, 0, 10_000))
        person_at = {r["id"]: r["_offset"] for r in rows[PERSONS]}
        auction_at = {r["id"]: r["_offset"] for r in rows[AUCTIONS]}
        for auction in rows[AUCTIONS]:
            assert person_at[auction["seller"]] < auction["_offset"]
            assert auction["expires"] > auction["date_time"]
            assert auction["reserve"] >= auction["initial_bid"] > 0
        for bid in rows[BIDS]:
            assert auction_at[bid["auction"]] < bid["_offset"]
            assert person_at[bid["bidder"]] < bid["_offset"]
            assert bid["price"] > 0


def test_bids_favour_recent_auctions() -> None:
    rows = read_rows(GeneratorSource(partitions=1, limit=50_000), Split("gen-0", 0, 50_000))
    # Among 3,000 auctions, the hot 100 before each bid take well over half of all bids.
    auction_at = {r["id"]: r["_offset"] for r in rows[AUCTIONS]}
    recent = sum(1 for bid in rows[BIDS] if bid["_offset"] - auction_at[bid["auction"]] < 100 * 50 // 3 + 50)
    assert recent > 0.7 * len(rows[BIDS])
    assert len({bid["auction"] for bid in rows[BIDS]}) > 1_000


@pytest.mark.parametrize(("limit", "partitions"), [(0, 1), (3, 4), (10, 4), (1_000_003, 7), (5, 1)])
def test_per_partition_limits_add_up_to_limit(limit: int, partitions: int) -> None:
    source = GeneratorSource(partitions=partitions, limit=limit)
    end = source.end()
    assert end is not None
    per_partition = [end.offset(f"gen-{i}") for i in range(partitions)]
    assert sum(per_partition) == limit
    assert max(per_partition) - min(per_partition) <= 1
    assert per_partition == sorted(per_partition, reverse=True)
    assert set(end.partitions()) <= {f"gen-{i}" for i in range(partitions)}


def test_unlimited_rate_exposes_everything_at_once() -> None:
    source = GeneratorSource(partitions=3, limit=10, now=lambda: 0)
    assert source.upper() == source.end() == Frontier({"gen-0": 4, "gen-1": 3, "gen-2": 3})


def test_unbounded_source_has_no_end() -> None:
    assert GeneratorSource(rate=10.0).end() is None


def test_upper_follows_rate_and_stops_at_limit() -> None:
    clock = FakeClock(500)
    source = GeneratorSource(partitions=2, rate=10.0, limit=31, anchor_ms=1_000, now=clock)
    assert source.upper() == Frontier()  # before the anchor nothing exists yet
    clock.now = 1_000
    assert source.upper() == Frontier()
    clock.now = 1_099
    assert source.upper() == Frontier()  # 5 events/s per partition: the first is due at 200 ms
    clock.now = 1_200
    assert source.upper() == Frontier({"gen-0": 1, "gen-1": 1})
    clock.now = 3_000
    assert source.upper() == Frontier({"gen-0": 10, "gen-1": 10})
    clock.now = 10_000_000
    assert source.upper() == source.end() == Frontier({"gen-0": 16, "gen-1": 15})


def test_fractional_rate_counts_exactly() -> None:
    clock = FakeClock(1_000)
    source = GeneratorSource(partitions=3, rate=0.3, now=clock)
    assert source.upper() == Frontier()
    clock.now = 10_000  # 0.1 events/s per partition: one each after exactly 10 s
    assert source.upper() == Frontier({"gen-0": 1, "gen-1": 1, "gen-2": 1})


@settings(max_examples=100, deadline=None)
@given(
    rate=st.floats(0.001, 1e7, allow_nan=False, allow_infinity=False),
    partitions=st.integers(1, 8),
    limit=st.none() | st.integers(0, 10**9),
    anchor=st.integers(0, 10**6),
    steps=st.lists(st.integers(0, 10**5), min_size=1, max_size=20),
)
def test_upper_never_regresses_for_a_non_decreasing_clock(
    rate: float, partitions: int, limit: int | None, anchor: int, steps: list[int]
) -> None:
    clock = FakeClock(0)
    source = GeneratorSource(partitions=partitions, rate=rate, limit=limit, anchor_ms=anchor, now=clock)
    previous = source.upper()
    for step in steps:
        clock.now += step
        upper = source.upper()
        assert previous.less_equal(upper)
        end = source.end()
        if end is not None:
            assert upper.less_equal(end)
        previous = upper


def test_splits_are_cut_at_max_split_offsets() -> None:
    source = GeneratorSource(partitions=2, limit=25, max_split_offsets=5)
    splits = source.splits(Frontier({"gen-0": 3}), source.upper())
    assert [(s.partition, s.start, s.end) for s in splits] == [
        ("gen-0", 3, 8),
        ("gen-0", 8, 13),
        ("gen-1", 0, 5),
        ("gen-1", 5, 10),
        ("gen-1", 10, 12),
    ]


def test_pickled_source_reads_the_same_rows() -> None:
    clock = FakeClock(60_000)
    source = GeneratorSource(partitions=2, rate=1_000.0, seed=9, now=lambda: clock.now)
    split = Split("gen-0", 100, 5_000)
    copy = pickle.loads(pickle.dumps(source))
    assert read_tables(copy, [split]) == read_tables(source, [split])
    assert source.upper() == Frontier({"gen-0": 30_000, "gen-1": 30_000})
    # The lambda clock stayed behind; the copy probes with the wall clock and sees far more.
    assert source.upper().less_equal(copy.upper())


def test_reading_outside_the_source_is_a_bug() -> None:
    source = GeneratorSource(partitions=2, limit=10)
    with pytest.raises(ValueError, match="gen-2"):
        list(source.read(Split("gen-2", 0, 1)))
    with pytest.raises(ValueError, match="limit"):
        list(source.read(Split("gen-1", 0, 6)))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"partitions": 0, "limit": 1}, "partitions"),
        ({"partitions": 2.5, "limit": 1}, "partitions"),
        ({"partitions": True, "limit": 1}, "partitions"),
        ({"rate": 0}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate": float("inf")}, "rate"),
        ({"rate": float("nan")}, "rate"),
        ({"rate": "fast"}, "rate"),
        ({"limit": -1}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({}, "rate"),
        ({"limit": 1, "seed": "x"}, "seed"),
        ({"limit": 1, "anchor_ms": 1.0}, "anchor_ms"),
        ({"limit": 1, "max_split_offsets": 0}, "max_split_offsets"),
        ({"limit": 1, "now": 5}, "now"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        GeneratorSource(**kwargs)
    assert info.value.field == field

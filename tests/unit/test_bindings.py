"""Bindings against naive oracles: reclocking, inversion, compaction and vectorised stamping."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock import UNBOUND, Bindings, Frontier, encode_partition
from tests.unit.strategies import binding_lists, build, partitions

offsets = st.integers(0, 80)


def oracle_reclock(bindings: list[tuple[int, Frontier]], p, o) -> int | None:
    """The reclock rule by a list scan: least T with o < R(T)[p]."""
    for t, f in bindings:
        if f.covers(p, o):
            return t
    return None


def oracle_source_upper_at(bindings, upper) -> Frontier:
    before = [f for t, f in bindings if t < upper]
    return before[-1] if before else Frontier()


def test_materialize_example_reclocks_as_documented():
    b = Bindings()
    b.mint(1000, Frontier({0: 3}))
    b.mint(11000, Frontier({0: 5}))
    assert [b.reclock(0, o) for o in range(6)] == [1000, 1000, 1000, 11000, 11000, None]
    assert b.upper == 11001 and b.source_upper_at(11000) == Frontier({0: 3})


def test_mint_rejects_time_that_does_not_advance():
    b = Bindings()
    b.mint(10, Frontier({0: 1}))
    with pytest.raises(ValueError, match="does not advance"):
        b.mint(10, Frontier({0: 2}))


def test_mint_rejects_a_regressing_frontier():
    b = Bindings()
    b.mint(10, Frontier({0: 5}))
    with pytest.raises(ValueError, match="regresses"):
        b.mint(11, Frontier({0: 4}))


def test_same_frontier_at_a_later_time_advances_time_only():
    b = Bindings()
    b.mint(10, Frontier({0: 5}))
    b.mint(20, Frontier({0: 5}))
    assert b.upper == 21 and b.reclock(0, 4) == 10 and b.reclock(0, 5) is None


def test_new_partition_binds_existing_data_at_one_time():
    b = Bindings()
    b.mint(10, Frontier({0: 5}))
    b.mint(20, Frontier({0: 5, 1: 100}))
    assert {b.reclock(1, o) for o in range(100)} == {20}


@given(binding_lists(), partitions, offsets)
def test_reclock_equals_the_list_scan_oracle(bindings, p, o):
    assert build(bindings).reclock(p, o) == oracle_reclock(bindings, p, o)


@given(binding_lists(), st.integers(0, 1000))
def test_source_upper_at_is_the_last_binding_before_the_upper(bindings, upper):
    assert build(bindings).source_upper_at(upper) == oracle_source_upper_at(bindings, upper)


@given(binding_lists(), partitions, offsets)
def test_a_record_complete_at_the_resume_frontier_is_bound_below_the_upper(bindings, p, o):
    b = build(bindings)
    for upper in [t + 1 for t, _ in bindings]:
        t = b.reclock(p, o)
        assert b.source_upper_at(upper).covers(p, o) == (t is not None and t < upper)


@given(binding_lists(), st.data())
def test_into_upper_of_is_the_first_binding_beyond_the_frontier(bindings, data):
    b = build(bindings)
    f = data.draw(st.sampled_from([Frontier(), *(f for _, f in bindings)]))
    expected = next((t for t, g in bindings if not g.less_equal(f)), b.upper)
    assert b.into_upper_of(f) == expected


@given(binding_lists(), st.data())
def test_compaction_commutes_with_reclocking(bindings, data):
    if not bindings:
        return
    since = data.draw(st.integers(0, bindings[-1][0]))
    compacted = build(bindings)
    compacted.compact(since)
    for p in [0, 1, 2, "gen-0", ("orders", 3), "never-seen"]:
        for o in range(0, 60, 3):
            before = oracle_reclock(bindings, p, o)
            expected = None if before is None else max(before, since)
            assert compacted.reclock(p, o) == expected
    assert compacted.since == since and compacted.upper == build(bindings).upper


def test_compaction_past_the_upper_is_refused():
    b = Bindings()
    b.mint(10, Frontier({0: 1}))
    with pytest.raises(ValueError, match="upper"):
        b.compact(11)


@given(binding_lists(), st.lists(st.tuples(partitions, offsets), max_size=40))
def test_vectorised_stamp_equals_reclock(bindings, rows):
    b = build(bindings)
    stamped = b.stamper().into_times(
        pa.array([encode_partition(p) for p, _ in rows], pa.string()), pa.array([o for _, o in rows], pa.int64())
    )
    expected = [b.reclock(p, o) for p, o in rows]
    assert stamped.tolist() == [UNBOUND if t is None else t for t in expected]


@given(binding_lists(), st.data())
def test_stamper_after_a_time_keeps_every_later_time_exact(bindings, data):
    finite = [t for t, f in bindings if not f.is_closed]
    if not finite:
        return
    after = data.draw(st.sampled_from(finite))
    b = build(bindings)
    lower = b.source_upper_at(after + 1)
    rows = [(p, o) for p in [0, 1, 2, "gen-0"] for o in range(lower.offset(p), lower.offset(p) + 25)]
    stamped = b.stamper(after=after).into_times(
        pa.array([encode_partition(p) for p, _ in rows]), pa.array([o for _, o in rows], pa.int64())
    )
    expected = [b.reclock(p, o) for p, o in rows]
    assert stamped.tolist() == [UNBOUND if t is None else t for t in expected]


def test_stamping_a_million_rows_is_vectorised():
    b = Bindings()
    for i in range(1, 1001):
        b.mint(i * 10, Frontier({"p": i * 1000}))
    offs = np.arange(1_000_000, dtype=np.int64)
    stamped = b.stamper().into_times(pa.array(["p"] * len(offs)), pa.array(offs))
    assert stamped[0] == 10 and stamped[999] == 10 and stamped[1000] == 20 and stamped[-1] == 10_000


@given(binding_lists(), st.lists(st.tuples(partitions, offsets), max_size=30), partitions)
def test_stamping_with_an_expected_partition_equals_the_general_path(bindings, rows, expected):
    b = build(bindings)
    parts = pa.array([encode_partition(p) for p, _ in rows], pa.string())
    offs = pa.array([o for _, o in rows], pa.int64())
    general = b.stamper().into_times(parts, offs)
    assert b.stamper().into_times(parts, offs, partition=encode_partition(expected)).tolist() == general.tolist()

"""Frontier algebra: a lattice with the closed frontier on top, and the partition codec."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock import Frontier, decode_partition, encode_partition
from tests.unit.strategies import frontiers


def test_unnamed_partitions_are_at_offset_zero():
    f = Frontier({0: 4})
    assert f == Frontier({0: 4, 1: 0})
    assert hash(f) == hash(Frontier({0: 4, 1: 0}))
    assert f.offset(1) == 0
    assert f.covers(0, 3) and not f.covers(0, 4) and not f.covers(1, 0)


def test_closed_frontier_covers_everything_and_is_above_all():
    closed = Frontier.closed()
    assert closed.is_closed and closed.covers("anything", 10**15)
    assert Frontier({0: 10**12}).less_equal(closed) and not closed.less_equal(Frontier({0: 10**12}))


def test_negative_offsets_are_rejected():
    with pytest.raises(ValueError, match="partition 0"):
        Frontier({0: -1})


@given(frontiers, frontiers)
def test_join_and_meet_are_commutative(a, b):
    assert a.join(b) == b.join(a)
    assert a.meet(b) == b.meet(a)


@given(frontiers, frontiers, frontiers)
def test_join_and_meet_are_associative(a, b, c):
    assert a.join(b).join(c) == a.join(b.join(c))
    assert a.meet(b).meet(c) == a.meet(b.meet(c))


@given(frontiers, frontiers)
def test_absorption_laws_hold(a, b):
    assert a.join(a.meet(b)) == a
    assert a.meet(a.join(b)) == a


@given(frontiers)
def test_join_and_meet_are_idempotent(a):
    assert a.join(a) == a and a.meet(a) == a


@given(frontiers, frontiers)
def test_less_equal_agrees_with_join_and_meet(a, b):
    assert a.less_equal(b) == (a.join(b) == b) == (a.meet(b) == a)
    assert a.meet(b).less_equal(a) and a.less_equal(a.join(b))


@given(frontiers, frontiers, frontiers)
def test_less_equal_is_a_partial_order(a, b, c):
    assert a.less_equal(a)
    if a.less_equal(b) and b.less_equal(a):
        assert a == b
    if a.less_equal(b) and b.less_equal(c):
        assert a.less_equal(c)


@given(frontiers)
def test_empty_is_bottom_and_closed_is_top(a):
    assert Frontier().less_equal(a) and a.less_equal(Frontier.closed())
    assert a.join(Frontier()) == a and a.meet(Frontier.closed()) == a


@given(frontiers)
def test_frontiers_survive_pickle_and_json(a):
    assert pickle.loads(pickle.dumps(a)) == a
    assert Frontier.from_json(a.to_json()) == a


partition_ids = st.one_of(
    st.integers(-(2**40), 2**40),
    st.text(max_size=12),
    st.tuples(st.text(max_size=6), st.integers(0, 100)),
)


@given(partition_ids)
def test_partition_codec_round_trips(p):
    assert decode_partition(encode_partition(p)) == p


def test_plain_partition_names_stay_readable():
    assert encode_partition("gen-0") == "gen-0"
    assert encode_partition(3) == "3"
    assert encode_partition("3") == '"3"'
    assert encode_partition(("orders", 3)) == '["orders",3]'

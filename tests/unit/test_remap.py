"""The remap table on real Delta tables: compare-and-append, adoption, faithful reloads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reclock import Frontier
from reclock.persist.remap import Redrive, RemapTable, Skip
from reclock.timeline.bindings import Bindings
from tests.unit.strategies import binding_lists


def test_stale_writer_fails_resyncs_and_mints_only_the_remainder(tmp_path):
    a = RemapTable(tmp_path / "remap")
    b = RemapTable(tmp_path / "remap")  # reads now: its view is empty and goes stale below
    assert a.mint(1000, Frontier({0: 3}))
    version_after_a = a.version
    assert b.mint(11000, Frontier({0: 5}))  # its first append fails, it re-syncs and retries
    assert b.version == version_after_a + 1
    reread = RemapTable(tmp_path / "remap").bindings
    assert list(reread) == [(1000, Frontier({0: 3})), (11000, Frontier({0: 5}))]
    assert [reread.reclock(0, o) for o in range(5)] == [1000, 1000, 1000, 11000, 11000]


def test_a_losing_writer_adopts_a_later_binding_instead_of_rebinding(tmp_path):
    a = RemapTable(tmp_path / "remap")
    b = RemapTable(tmp_path / "remap")
    assert a.mint(2000, Frontier({0: 7}))
    assert not b.mint(1500, Frontier({0: 9}))  # its time no longer advances: adopt, do not rebind
    assert list(b.bindings) == [(2000, Frontier({0: 7}))]
    assert not b.mint(2500, Frontier({0: 6}))  # its frontier would regress: adopt
    assert RemapTable(tmp_path / "remap").version == a.version


@settings(max_examples=25)
@given(binding_lists(max_size=6))
def test_reloading_the_table_rebuilds_identical_bindings(tmp_path_factory, bindings):
    path = tmp_path_factory.mktemp("remap")
    table = RemapTable(path)
    for t, f in bindings:
        assert table.mint(t, f)
    reloaded = RemapTable(path).bindings
    assert list(reloaded) == list(table.bindings) == bindings
    assert reloaded.is_closed == table.bindings.is_closed


@settings(max_examples=25, deadline=None)
@given(binding_lists(max_size=6).filter(bool), st.integers(0, 6), st.integers(0, 3))
def test_compaction_is_one_file_that_reloads_as_the_compacted_bindings(tmp_path_factory, bindings, cut, extra):
    """``compact`` then reload equals compacting in memory, at every since, and keeps skips."""
    path = tmp_path_factory.mktemp("remap")
    table = RemapTable(path)
    for t, f in bindings:
        assert table.mint(t, f)
    skip = Skip(bindings[0][0], 0, 0, 1, "bad")
    table.record_skips([skip])
    since = bindings[min(cut, len(bindings) - 1)][0] + extra
    since = min(since, table.bindings.upper - 1)
    expected = Bindings()
    for t, f in bindings:
        expected.mint(t, f)
    expected.compact(max(t for t, _ in bindings if t <= since) if any(t <= since for t, _ in bindings) else 0)

    assert table.compact(since)
    assert table.files == 1
    for view in (table.bindings, RemapTable(path).bindings):
        assert list(view) == list(expected)
        assert view.since == expected.since
        assert view.is_closed == expected.is_closed
    assert RemapTable(path).skips == [skip]


def test_a_compacted_table_reclocks_every_record_above_since_as_before_and_mints_on(tmp_path):
    table = RemapTable(tmp_path / "remap")
    for i in range(1, 6):
        assert table.mint(1000 * i, Frontier({0: 10 * i, 1: 5 * i}))
    before = [(p, o, table.bindings.reclock(p, o)) for p in (0, 1) for o in range(60)]
    assert table.compact(3000)
    reopened = RemapTable(tmp_path / "remap")
    assert reopened.bindings.since == 3000
    for p, o, t in before:
        assert (
            reopened.bindings.reclock(p, o) == max(t, 3000)
            if t is not None
            else reopened.bindings.reclock(p, o) is None
        )
    assert reopened.bindings.source_upper_at(4000) == Frontier({0: 30, 1: 15})
    assert reopened.mint(6000, Frontier({0: 70, 1: 35}))
    assert list(RemapTable(tmp_path / "remap").bindings)[-1] == (6000, Frontier({0: 70, 1: 35}))


def test_a_redrive_is_minted_with_its_binding_and_survives_compaction_apart_from_skips(tmp_path):
    """A redrive's binding and the records it lands are one commit; compaction keeps them."""
    table = RemapTable(tmp_path / "remap")
    for i in range(1, 4):
        assert table.mint(1000 * i, Frontier({0: 10 * i}))
    skip = Skip(3000, 0, 20, 25, "failed")
    assert table.record_skips([skip]) == [skip]
    redrives = [Redrive(4000, 0, 3, 5, ()), Redrive(4000, ("t", 1), 7, 8, ("ratio", "big"))]
    assert table.mint_with_skips(4000, Frontier({0: 30}), [], redrives)
    assert not table.mint_with_skips(4000, Frontier({0: 30}), [], redrives)  # already bound: nothing twice
    for view in (table, RemapTable(tmp_path / "remap")):
        assert view.redrives == redrives and view.skips == [skip]
        assert list(view.bindings)[-1] == (4000, Frontier({0: 30}))  # time moves, the frontier does not
    assert table.compact(3000)
    reopened = RemapTable(tmp_path / "remap")
    assert reopened.redrives == redrives and reopened.skips == [skip] and reopened.bindings.since == 3000


def test_compaction_racing_a_mint_loses_and_changes_nothing(tmp_path):
    """Compaction is a compare-and-append too: a writer's binding that slipped in is never lost."""
    a = RemapTable(tmp_path / "remap")
    for i in range(1, 4):
        assert a.mint(1000 * i, Frontier({0: i}))
    b = RemapTable(tmp_path / "remap")
    assert b.mint(4000, Frontier({0: 9}))
    assert not a.compact(2000)
    assert list(a.bindings)[-1] == (4000, Frontier({0: 9}))  # re-read: it saw b's binding
    reread = RemapTable(tmp_path / "remap").bindings
    assert reread.since == 0 and len(reread) == 4
    assert a.compact(2000)
    assert list(RemapTable(tmp_path / "remap").bindings) == [
        (2000, Frontier({0: 2})),
        (3000, Frontier({0: 3})),
        (4000, Frontier({0: 9})),
    ]
    assert not b.mint(5000, Frontier({0: 5}))  # b's view is stale: its mint fails, it re-reads and adopts
    assert RemapTable(tmp_path / "remap").bindings.since == 2000

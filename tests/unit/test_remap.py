"""The remap table on real Delta tables: compare-and-append, adoption, faithful reloads."""

from __future__ import annotations

from hypothesis import given, settings

from persist.remap import RemapTable
from reclock import Frontier
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

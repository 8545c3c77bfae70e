"""``reclock detach``: outputs handed to the user, and a start that checks what they did.

Ground truth is the generator's: each partition holds offsets ``0 .. limit / partitions``, each in
exactly one output row. The user's changes are made with deltalake directly, as a user would, and
the lake is read back with the test's own Delta-log reader.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, Field, write_deltalake

from reclock.cli.main import main
from tests.faults.reader import DeltaLog, read_rows

CONFIG = """
[pipeline]
name = "orders"
lake = "lake"
engine = "local"
max_batch = 3000

[source]
kind = "generator"
partitions = 2
limit = 40000
"""
PER_PARTITION = 20000
OUTPUTS = ("persons", "auctions", "bids")


@pytest.fixture
def detached(tmp_path, monkeypatch, capsys):
    """A pipeline that loaded part of its source and was detached; returns its outputs folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(CONFIG)
    assert main(["create", "p.toml"]) == 0
    assert main(["--lake", "lake", "start", "orders", "--max-seconds", "0"]) == 0
    assert main(["--lake", "lake", "detach", "orders"]) == 0
    assert "is detached" in capsys.readouterr().out
    assert main(["--lake", "lake", "status", "orders", "--json"]) == 0
    assert '"health": "detached"' in capsys.readouterr().out
    return tmp_path / "lake" / "orders" / "outputs"


def _offsets(outputs) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for output in OUTPUTS:
        rows = read_rows(DeltaLog(outputs / output).refresh(), ["_partition", "_offset"])
        for partition, offset in zip(rows["_partition"].to_pylist(), rows["_offset"].to_pylist(), strict=True):
            seen.setdefault(partition, []).append(offset)
    return seen


def test_an_additive_change_while_detached_then_start_continues_exactly_once(detached, capsys):
    before = {o: DeltaLog(detached / o).refresh().version for o in OUTPUTS}
    DeltaTable(str(detached / "bids")).alter.add_columns(Field("note", "string", nullable=True))
    DeltaTable(str(detached / "persons")).optimize.compact()

    assert main(["--lake", "lake", "start", "orders"]) == 0
    assert DeltaLog(detached / "bids").refresh().version > before["bids"] + 1  # loading went on after the change
    seen = _offsets(detached)
    assert {p: sorted(o) for p, o in seen.items()} == {f"gen-{i}": list(range(PER_PARTITION)) for i in (0, 1)}
    notes = DeltaTable(str(detached / "bids")).to_pyarrow_table(columns=["note"])["note"]
    assert notes.null_count == len(notes) > 0  # the user's column is kept and reads null on reclock's rows
    capsys.readouterr()
    assert main(["--lake", "lake", "status", "orders", "--json"]) == 0
    assert '"health": "detached"' not in capsys.readouterr().out


def test_an_overwrite_that_keeps_the_schema_is_the_users_rows_and_start_continues_once(detached):
    """An overwrite (``mode="overwrite"``, same schema) replaces rows, not the table: its commit
    label survives, so it is accepted like any delete and insert, and loading goes on exactly
    where it stopped. The user's rows are theirs; reclock adds every later record once."""
    bids = DeltaTable(str(detached / "bids")).to_pyarrow_table()
    loaded = set(zip(bids["_partition"].to_pylist(), bids["_offset"].to_pylist(), strict=True))
    kept = bids.filter(pc.equal(pc.bit_wise_and(bids["_offset"], 1), 0))  # the user keeps even offsets
    write_deltalake(str(detached / "bids"), kept, mode="overwrite")
    dropped = loaded - set(zip(kept["_partition"].to_pylist(), kept["_offset"].to_pylist(), strict=True))
    assert dropped and kept.num_rows

    assert main(["--lake", "lake", "start", "orders"]) == 0
    seen = _offsets(detached)
    everything = {(f"gen-{i}", o) for i in (0, 1) for o in range(PER_PARTITION)}
    assert sorted((p, o) for p, offsets in seen.items() for o in offsets) == sorted(everything - dropped)


def _drop_column(outputs) -> None:
    table = DeltaTable(str(outputs / "bids")).to_pyarrow_table()
    write_deltalake(str(outputs / "bids"), table.drop_columns(["price"]), mode="overwrite", schema_mode="overwrite")


def _retype_column(outputs) -> None:
    table = DeltaTable(str(outputs / "bids")).to_pyarrow_table()
    price = table.column("price").cast(pa.float64())
    retyped = table.set_column(table.schema.get_field_index("price"), "price", price)
    write_deltalake(str(outputs / "bids"), retyped, mode="overwrite", schema_mode="overwrite")


def _required_column(outputs) -> None:
    DeltaTable(str(outputs / "bids")).alter.add_columns(Field("region", "string", nullable=False))


def _recreate(outputs) -> None:
    table = DeltaTable(str(outputs / "bids")).to_pyarrow_table()
    shutil.rmtree(outputs / "bids")
    write_deltalake(str(outputs / "bids"), table)


def _delete(outputs) -> None:
    shutil.rmtree(outputs / "bids")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (_drop_column, "output 'bids' lost column 'price' while detached"),
        (_retype_column, "output 'bids' changed column 'price' from int64 to double while detached"),
        (_required_column, "output 'bids' gained column 'region', which is not nullable"),
        (_recreate, "output 'bids' was replaced or recreated (reclock's commit label is gone)"),
        (_delete, "output 'bids' was deleted while detached"),
    ],
)
def test_an_incompatible_change_is_refused_in_one_line_and_nothing_loads(detached, capsys, change, says):
    change(detached)
    versions = {o: DeltaLog(detached / o).refresh().version for o in OUTPUTS if (detached / o).exists()}
    capsys.readouterr()
    assert main(["--lake", "lake", "start", "orders"]) == 1
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert {o: DeltaLog(detached / o).refresh().version for o in versions} == versions
    assert main(["--lake", "lake", "status", "orders", "--json"]) == 0
    assert '"health": "detached"' in capsys.readouterr().out  # still detached until the change is undone

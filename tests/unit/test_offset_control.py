"""``reclock set-offsets`` and ``reclock offsets``: a skip is one remap commit, loaded exactly once.

Ground truth is the generator's own: each partition holds offsets ``0 .. limit / partitions``,
one event each, so after a skip every offset outside the skipped range is in exactly one output
row and the skipped range is one ``_errors`` row. The lake is read with the test's own Delta-log
reader, not reclock's.
"""

from __future__ import annotations

import json

import pytest

from reclock.cli.main import main
from reclock.persist.lake import Lake
from reclock.persist.remap import USER_SKIP, RemapTable, Skip
from reclock.timeline.frontier import Frontier
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


def _offsets(lake, capsys) -> dict[str, dict]:
    capsys.readouterr()
    assert main(["--lake", str(lake), "offsets", "orders", "--json"]) == 0
    return {row["partition"]: row for row in json.loads(capsys.readouterr().out)}


def _landed(lake) -> dict[str, list[int]]:
    """Offsets per partition over every output, and the ``_errors`` rows, read from the Delta log."""
    seen: dict[str, list[int]] = {}
    for output in OUTPUTS:
        rows = read_rows(DeltaLog(lake / "orders" / "outputs" / output).refresh(), ["_partition", "_offset"])
        for partition, offset in zip(rows["_partition"].to_pylist(), rows["_offset"].to_pylist(), strict=True):
            seen.setdefault(partition, []).append(offset)
    return seen


def test_a_skip_ahead_is_loaded_exactly_once_around_the_range_and_shown(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(CONFIG)
    lake = tmp_path / "lake"
    assert main(["create", "p.toml"]) == 0
    # Bind part of the source, then stop: a skip must start where the bindings end, not at 0.
    assert main(["--lake", str(lake), "start", "orders", "--max-seconds", "0"]) == 0
    before = _offsets(lake, capsys)
    assert set(before) == {"gen-0", "gen-1"}
    bound = before["gen-0"]["bound"]
    assert 0 < bound < PER_PARTITION and before["gen-0"]["latest"] == PER_PARTITION and before["gen-0"]["skipped"] == 0
    target = bound + 4321

    assert main(["--lake", str(lake), "set-offsets", "orders", "gen-0", str(target)]) == 0
    assert f"[{bound}, {target})" in capsys.readouterr().out
    assert _offsets(lake, capsys)["gen-0"]["skipped"] == target - bound

    assert main(["--lake", str(lake), "start", "orders"]) == 0  # to the end of the bounded source
    seen = _landed(lake)
    skipped = set(range(bound, target))
    assert sorted(seen["gen-0"]) == [o for o in range(PER_PARTITION) if o not in skipped]
    assert sorted(seen["gen-1"]) == list(range(PER_PARTITION))
    errors = read_rows(DeltaLog(lake / "orders" / "outputs" / "_errors").refresh())
    assert errors.num_rows == 1
    row = errors.to_pylist()[0]
    assert (row["kind"], row["_partition"], row["_offset"]) == ("skipped", "gen-0", bound)
    assert f"offsets [{bound}, {target}) of partition gen-0 skipped: {USER_SKIP}" in row["message"]
    after = _offsets(lake, capsys)["gen-0"]
    assert after["loaded"] is None and after["bound"] is None  # the bounded source is all loaded
    assert after["skipped"] == target - bound
    assert main(["--lake", str(lake), "offsets", "orders"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["gen-0", "20000", "all", "all", "0", "4321"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["gen-7", "10"], "has no partition gen-7 (known: gen-0, gen-1)"),
        (["gen-0", "999999"], "past the source's latest, 20000"),
        (["gen-0", "0"], "already at offset 0"),
        (['["gen-0","@reread-1"]', "0"], "has no partition"),
    ],
)
def test_a_bad_skip_is_one_line_naming_the_field_and_changes_nothing(tmp_path, capsys, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(CONFIG)
    assert main(["create", "p.toml"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "set-offsets", "orders", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert RemapTable(Lake.at("lake").remap_path("orders")).bindings.upper == 0


def test_going_back_is_refused_for_a_source_that_cannot_re_read(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(CONFIG)
    assert main(["create", "p.toml"]) == 0
    assert main(["--lake", "lake", "start", "orders", "--max-seconds", "0"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "set-offsets", "orders", "gen-1", "1"]) == 2
    err = capsys.readouterr().err
    assert "offset 1 of partition gen-1 is below" in err and "this source cannot re-read" in err


def test_a_files_pipeline_is_told_to_use_drop_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    files = 'kind = "files"\npath = "in"\nformat = "jsonl"\ncolumns = {id = "int64"}'
    (tmp_path / "p.toml").write_text(CONFIG.replace('kind = "generator"\npartitions = 2\nlimit = 40000', files))
    assert main(["create", "p.toml"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "set-offsets", "orders", "x", "1"]) == 2
    assert "reclock drop-file" in capsys.readouterr().err


def test_a_failed_batch_still_records_its_own_skip_beside_a_user_skip(tmp_path):
    remap = RemapTable(tmp_path / "remap")
    user = Skip(5, "a", 0, 10, f"{USER_SKIP} by the user")
    assert remap.mint_with_skips(5, Frontier({"a": 10, "b": 3}), [user])
    failed = [Skip(5, "b", 0, 3, "bad data (failed 3 attempts)")]
    assert remap.record_skips(failed) == failed
    assert sorted(RemapTable(tmp_path / "remap").skips, key=lambda s: s.partition) == [user, *failed]
    assert remap.record_skips([Skip(5, "b", 1, 3, "another run")]) == failed  # the first recorded still wins


def test_a_re_read_partition_names_its_original_and_generation():
    from reclock.timeline.frontier import Reread, decode_partition, encode_partition

    copy = Reread(("orders", 3), 2)
    assert encode_partition(copy) == '["orders",3,"@reread-2"]'  # what remap tables have always stored
    assert decode_partition(encode_partition(copy)) == copy
    assert decode_partition('["orders",3,"@reread-2"]') == Reread(("orders", 3), 2)  # an old lake's row
    assert decode_partition(encode_partition(Reread("gen-0", 1))) == Reread("gen-0", 1)
    assert encode_partition(Reread("gen-0", 1)) == '["gen-0","@reread-1"]'
    assert decode_partition('["orders",3]') == ("orders", 3) and decode_partition("x") == "x"
    assert decode_partition('["a","@reread-x"]') == ("a", "@reread-x")
    assert decode_partition(encode_partition(("orders", 3, "@reread-1"))) == Reread(("orders", 3), 1)  # reserved


def test_a_re_read_and_the_live_range_of_one_kafka_partition_are_read_in_separate_waves():
    from reclock.sources.base import Split
    from reclock.sources.kafka.source import _waves
    from reclock.timeline.frontier import Reread

    live, other = ("t", 0), ("t", 1)
    splits = [Split(live, 50, 60), Split(Reread(live, 1), 10, 50), Split(other, 0, 5), Split(Reread(live, 2), 0, 9)]
    waves = _waves(splits)
    assert waves == [[splits[0], splits[2]], [splits[1]], [splits[3]]]
    assert sorted(splits.index(s) for wave in waves for s in wave) == [0, 1, 2, 3]

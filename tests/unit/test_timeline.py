"""One cut across pipelines: ``read_as_of(lake, [pipelines], T)`` and ``reclock as-of``."""

from __future__ import annotations

import contextlib
import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reclock.cli.main import main
from reclock.persist.asof import latest_cut, read_as_of, readable_upper
from reclock.runtime.pipeline import Pipeline
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash

PIPELINE = """
[pipeline]
name = "{name}"
lake = "{lake}"
engine = "local"

[source]
kind = "generator"
partitions = 2
limit = {limit}
"""


def test_a_cut_across_pipelines_waits_for_the_slowest_and_names_it(tmp_path):
    clock = FakeClock(1_000)
    sources = {name: MemorySource({"rows": pa.schema([("n", pa.int64())])}) for name in ("a", "b")}
    for ms in (1_000, 2_000):
        clock.ms = ms
        for name, source in sources.items():
            source.append(0, "rows", [{"n": ms}])
            crash = CrashAt("committed:rows") if (name, ms) == ("b", 2_000) else None
            with contextlib.suppress(SimulatedCrash):
                Pipeline(name, tmp_path, source, now=clock, on_step=crash).step()
    assert readable_upper(tmp_path, "a") == 2_001 and readable_upper(tmp_path, ["a", "b"]) == 1_001
    with pytest.raises(ValueError, match=r"a, b: no consistent cut at 1001 yet; .* is 1001 \(held back by 'b'\)"):
        read_as_of(tmp_path, ["a", "b"], 1_001)
    cut = read_as_of(tmp_path, ["a", "b"], 1_000)
    assert {p: c["rows"].column("n").to_pylist() for p, c in cut.items()} == {"a": [1_000], "b": [1_000]}
    # b's rows output already holds 2000 (its _errors does not): the cut leaves it out, by _into_ts
    assert sorted(DeltaTable(f"{tmp_path}/b/outputs/rows").to_pyarrow_table()["n"].to_pylist()) == [1_000, 2_000]
    assert latest_cut(tmp_path, ["a", "b"]) == 1_000
    with pytest.raises(ValueError, match="at least one pipeline"):
        read_as_of(tmp_path, [], 1_000)


def test_reclock_as_of_prints_one_cut_across_pipelines_and_refuses_past_the_joint_upper(tmp_path, capsys):
    lake = tmp_path / "lake"
    for name, limit in (("orders", 2_000), ("events", 500), ("later", 100)):
        path = tmp_path / f"{name}.toml"
        path.write_text(PIPELINE.format(name=name, lake=lake, limit=limit))
        assert main(["create", str(path)]) == 0
    for name in ("orders", "events"):
        assert main(["--lake", str(lake), "start", name]) == 0
    capsys.readouterr()
    assert main(["--lake", str(lake), "as-of", "orders", "events", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {p: sum(c.values()) for p, c in printed["pipelines"].items()} == {"orders": 2_000, "events": 500}
    assert main(["--lake", str(lake), "as-of", "orders", "events"]) == 0
    assert "consistent cut of orders, events at into time" in capsys.readouterr().out
    # "later" was created but never ran: it holds every cut back, and the command says so in one line
    assert main(["--lake", str(lake), "as-of", "orders", "later", "--at", "5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "joint readable upper is 0 (held back by 'later')" in err

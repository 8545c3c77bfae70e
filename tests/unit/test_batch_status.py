"""The ``batches`` status table: a batch is visible while it runs, and says where its time went.

The job runs in a thread of the test process with a generator whose reads wait on a gate the test
holds, so a batch is provably in flight while the table is read; rows are read back from the
status table's Delta log with the test's own reader.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pyarrow as pa

from reclock.cli.main import main
from reclock.job import lifecycle
from reclock.persist.lake import Lake
from reclock.sources.base import Split
from reclock.sources.generator import GeneratorSource
from tests.faults.reader import DeltaLog, read_rows

GATE = threading.Event()


class GatedGenerator(GeneratorSource):
    """The generator, but every read waits until the test opens :data:`GATE`."""

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        GATE.wait(60)
        return super().read(split)


CONFIG = f"""
[pipeline]
name = "orders"
lake = "lake"
engine = "local"
max_batch = 2000

[source]
kind = "{__name__}:GatedGenerator"
partitions = 2
limit = 6000
"""


def _batches(capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["--lake", "lake", "batches", "orders", "--json", "--limit", "0"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_running_batch_shows_in_progress_then_its_phases(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(CONFIG)
    assert main(["create", "p.toml"]) == 0
    GATE.clear()
    running = threading.Thread(target=lifecycle.run, args=(Lake.at("lake"), "orders"), daemon=True)
    running.start()
    try:
        deadline = time.monotonic() + 60
        shown: list[dict] = []
        while time.monotonic() < deadline and not shown:
            shown = [r for r in _batches(capsys) if r["state"] == "In Progress"]
            time.sleep(0.2)
        assert len(shown) == 1 and shown[0]["plan_ms"] is not None and shown[0]["read_ms"] is None
    finally:
        GATE.set()
    running.join(120)
    assert not running.is_alive()

    settled = _batches(capsys)
    assert settled and {r["state"] for r in settled} == {"Succeeded", "No Data"}  # In Progress rows are hidden
    raw = read_rows(DeltaLog(tmp_path / "lake" / "_status" / "batches").refresh()).to_pylist()
    started = {r["batch_id"] for r in raw if r["state"] == "In Progress"}
    assert started == {r["batch_id"] for r in settled}  # every batch was announced before it read
    splits: dict[int, list[dict]] = {}
    for r in (r for r in raw if r["state"] == "Succeeded"):
        assert None not in (r["plan_ms"], r["read_ms"], r["commit_ms"])
        splits.setdefault(r["batch_id"], []).append(r)
    for rows in splits.values():  # the generator's splits are read one after another, inside the read phase
        assert sum(r["duration_ms"] for r in rows) <= rows[0]["read_ms"] + len(rows)
    first = min(settled, key=lambda r: r["batch_id"])
    assert first["probe_ms"] is not None and first["mint_ms"] is not None
    gated = [r for r in raw if r["state"] == "Succeeded" and r["batch_id"] == shown[0]["batch_id"]]
    assert gated and all(r["read_ms"] >= 200 for r in gated)  # the read waited for the gate

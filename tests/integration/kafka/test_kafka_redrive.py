"""``reclock redrive`` on Kafka: failed records are read again from the broker, keys and all.

Records written with ``;`` are read as CSV with the default ``,`` and fail; after the definition
is fixed (``delimiter = ";"``) a redrive lands each once, with its key read back from the topic
(``_errors`` keeps only the value, so a key in the row proves the record was fetched again).
Ground truth is what the producer got acked; the lake is read with the test's own log reader.
"""

from __future__ import annotations

from reclock.persist.lake import Lake
from reclock.timeline.frontier import encode_partition
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, read_rows
from tests.integration.helpers import write_config
from tests.waiting import run_until


def _config(path, bootstrap: str, topic: str, **extra):
    return write_config(
        path,
        pipeline={"name": "csvs", "lake": str(path.parent / "lake"), "engine": "local"},
        source={
            "kind": "kafka",
            "bootstrap_servers": bootstrap,
            "topics": [topic],
            "format": "csv",
            "schema": {"id": "int64", "name": "string"},
            "metadata": {"key": "kafka_key"},
            "key_format": "text",
            **extra,
        },
    )


def test_failed_kafka_records_are_fetched_again_and_land_once_with_their_keys(broker, topic, produce, tmp_path):
    t = topic(partitions=2)
    values = [f"{i},n{i}".encode() if i % 3 else f"{i};n{i}".encode() for i in range(30)]
    keys = [f"k{i}".encode() for i in range(30)]
    acked = produce.send(t, values, keys=keys, partition=lambda i: i % 2)
    lake = tmp_path / "lake"
    config = _config(tmp_path / "p.toml", broker.bootstrap, t)
    assert reclock_in_process("create", str(config)).returncode == 0
    out = lake / "csvs" / "outputs"

    def landed(output: str) -> int:
        table = read_rows(DeltaLog(out / output).refresh())
        return table.num_rows if table is not None else 0

    run_until(  # a live source: it runs until the 20 good records landed and the 10 bad ones failed
        Lake.at(str(lake)), "csvs", lambda: landed(t.replace("-", "_")) >= 20 and landed("_errors") >= 10, "30 records"
    )
    bad = {(encode_partition((tt, p)), o): i for i, (tt, p, o) in enumerate(acked) if i % 3 == 0}
    errors = read_rows(DeltaLog(out / "_errors").refresh()).to_pylist()
    assert {(e["_partition"], e["_offset"]) for e in errors} == set(bad)

    fixed = _config(tmp_path / "p.toml", broker.bootstrap, t, delimiter=";")
    assert reclock_in_process("create", str(fixed), "--replace").returncode == 0
    again = reclock_in_process("--lake", str(lake), "redrive", "csvs")
    assert again.returncode == 0 and f"landed {len(bad)} into " in again.stdout, again.stdout + again.stderr
    rows = read_rows(DeltaLog(out / t.replace("-", "_")).refresh()).to_pylist()
    by_coordinate = {(r["_partition"], r["_offset"]): r for r in rows}
    assert len(rows) == len(by_coordinate) == 30  # every record once: 20 at first, 10 re-driven
    for coordinate, i in bad.items():
        row = by_coordinate[coordinate]
        assert (row["id"], row["name"], row["kafka_key"]) == (i, f"n{i}", f"k{i}")
    twice = reclock_in_process("--lake", str(lake), "redrive", "csvs")
    assert twice.returncode == 0 and f"landed before {len(bad)}" in twice.stdout
    assert read_rows(DeltaLog(out / t.replace("-", "_")).refresh()).num_rows == 30

"""One timeline across pipelines: a Kafka, a files and a generator pipeline on one lake.

The pipelines share a clock, so every tick is one label time for all three. After each tick the
test takes the cross-pipeline cut at every label time that has become readable, and checks that a
time at or past the joint readable upper is refused while one pipeline lags (a crash between its
output commits). At the end an outside reader (pyarrow over each table's ``_delta_log``) checks
each recorded cut: every output at ``T`` holds exactly the final table's rows with ``_into_ts <=
T``, and those are exactly the records the test made exist at ticks ``<= T`` (the producer's acks,
the lines written, the generator's events by then).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reclock.persist.asof import latest_cut, read_as_of, readable_upper
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.sources.base import Split
from reclock.sources.files import FilesSource
from reclock.sources.generator import GeneratorSource
from reclock.sources.kafka import KafkaSource
from reclock.testing import CrashAt, FakeClock, SimulatedCrash
from reclock.timeline.frontier import encode_partition

TICKS = range(1_000, 9_000, 1_000)
RATE = 40  # generator events a second: 40 a tick
#: tick -> (pipeline, step): that pipeline's batch of that tick crashes there; it restarts next tick.
CRASHES = {3_000: ("gen", "committed:persons"), 5_000: ("files", "written"), 6_000: ("kafka", "committed:{topic}")}


def _delta_rows(table: Path) -> list[dict]:
    """The table's live rows from its log alone: adds minus removes, parquet read by pyarrow."""
    live: set[str] = set()
    for log in sorted((table / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(action["add"]["path"])
            elif "remove" in action:
                live.discard(action["remove"]["path"])
    parts = [pq.read_table(table / path) for path in sorted(live)]
    return pa.concat_tables(parts).to_pylist() if parts else []


def _bag(rows: list[dict]) -> Counter:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


def test_the_cross_pipeline_cut_is_consistent_at_every_label_time(tmp_path, broker, topic, produce):
    lake, inbox = tmp_path / "lake", tmp_path / "inbox"
    inbox.mkdir()
    name = topic(partitions=2)
    clock = FakeClock(TICKS[0])
    sources = {
        "kafka": KafkaSource(broker.bootstrap, topics=[name]),
        "files": FilesSource(path=inbox, columns={"n": "int64"}),
        "gen": GeneratorSource(partitions=2, rate=RATE, now=clock),
    }
    names = list(sources)
    topic_output = sources["kafka"].outputs()[0].name

    def start(pipeline: str, crash: str | None = None) -> Pipeline:
        hook = CrashAt(crash) if crash else None
        return Pipeline(pipeline, lake, sources[pipeline], data_plane=LocalDataPlane(), now=clock, on_step=hook)

    made: dict[int, dict[str, set]] = {}  # tick -> pipeline -> the records made to exist then
    cuts: dict[int, dict[str, dict[str, list[dict]]]] = {}
    crashed: set[str] = set()
    refusals = 0
    for tick in TICKS:
        clock.ms = tick
        acked = produce.send(name, [f"k{tick}-{i}".encode() for i in range(6)], partition=lambda i: i % 2)
        (inbox / f"{tick}.jsonl").write_text("".join(f'{{"n": {tick + i}}}\n' for i in range(3)))
        made[tick] = {
            "kafka": {(encode_partition((t, p)), o) for t, p, o in acked},
            "files": {tick + i for i in range(3)},
        }
        for pipeline in names:
            crash = CRASHES.get(tick, (None, None))
            if pipeline in crashed:  # the restart: catch up the pending binding, then this tick's
                start(pipeline).step()
                crashed.discard(pipeline)
            try:
                start(pipeline, crash[1].format(topic=topic_output) if crash[0] == pipeline else None).step()
            except SimulatedCrash:
                crashed.add(pipeline)
        joint = readable_upper(lake, names)
        for label in TICKS:
            if label > tick:
                break
            if label < joint and label not in cuts:
                cuts[label] = {
                    p: {o: t.to_pylist() for o, t in c.items()} for p, c in read_as_of(lake, names, label).items()
                }
        if crashed:  # the lagging pipeline holds back the cut, and the read says so
            [lagging] = crashed
            assert joint <= tick
            with pytest.raises(ValueError, match=f"joint readable upper is {joint} \\(held back by '{lagging}'\\)"):
                read_as_of(lake, names, tick)
            read_as_of(lake, [p for p in names if p != lagging], tick)  # the others alone are readable
            refusals += 1
    assert refusals == len(CRASHES)
    assert sorted(cuts) == list(TICKS)  # every label time was cut, each as soon as it was readable
    assert latest_cut(lake, names) == TICKS[-1]

    # The outside check: each cut against the final tables and against what the test made exist.
    final = {p: {o.name: _delta_rows(lake / p / "outputs" / o.name) for o in [*sources[p].outputs()]} for p in names}
    for label, cut in cuts.items():
        for pipeline, outputs in cut.items():
            assert set(outputs) == {*final[pipeline], "_errors"}
            for output, rows in outputs.items():
                if output in final[pipeline]:
                    expected = [r for r in final[pipeline][output] if r["_into_ts"] <= label]
                    assert _bag(rows) == _bag(expected), (label, pipeline, output)
        kafka = {(r["_partition"], r["_offset"]) for r in cut["kafka"][topic_output]}
        assert kafka == set().union(*(made[t]["kafka"] for t in TICKS if t <= label))
        files = [r["n"] for r in cut["files"]["rows"]]
        assert sorted(files) == sorted(set().union(*(made[t]["files"] for t in TICKS if t <= label)))
        generator = GeneratorSource(partitions=2, rate=RATE, now=lambda label=label: label)
        for output in ("persons", "auctions", "bids"):
            expected = {
                (r["_partition"], r["_offset"])
                for split_end in generator.upper().items()
                for out, batch in generator.read(Split(split_end[0], 0, split_end[1]))
                if out == output
                for r in batch.select(["_partition", "_offset"]).to_pylist()
            }
            got = {(r["_partition"], r["_offset"]) for r in cut["gen"][output]}
            assert got == expected, (label, output)


@pytest.mark.kafka  # the demo's embedded broker
def test_the_demo_of_four_pipelines_ends_with_one_cut_holding_every_record(tmp_path, postgres):
    from reclock.demo.run import run_demo
    from reclock.demo.timeline import PIPELINES
    from reclock.demo.transfers import ACCOUNTS, DATABASE, TOTAL
    from reclock.persist.lake import Lake
    from tests.integration.helpers import expected_generator_offsets

    out = io.StringIO()
    try:
        as_of = run_demo(
            Lake.at(tmp_path / "lake"),
            events=3_000,
            rate=1_000_000,
            engine="local",
            out=out,
            source="all",
            server=postgres,
        )
    finally:
        with closing(postgres.connect(DATABASE)) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot('reclock_demo_postgres')")
    assert as_of is not None, out.getvalue()
    cut = read_as_of(tmp_path / "lake", list(PIPELINES), as_of)
    events = {k: len(v) for k, v in expected_generator_offsets(4, 3_000).items()}
    expected = {
        "demo_kafka": {**events, "_errors": 0},
        "demo_files": {"readings": 20 * 250, "_errors": 0},
        "demo_generator": {**events, "_errors": 0},
        "demo_postgres": {"public_checking": ACCOUNTS, "public_savings": ACCOUNTS, "_errors": 0},
    }
    bank = cut["demo_postgres"]
    assert sum(sum(bank[f"public_{t}"]["balance"].to_pylist()) for t in ("checking", "savings")) == TOTAL
    with closing(postgres.connect(DATABASE)) as conn, conn.cursor() as cur:
        for table in ("checking", "savings"):
            cur.execute(f"SELECT account, balance FROM {table}")
            rows = bank[f"public_{table}"]
            mine = dict(zip(rows["account"].to_pylist(), rows["balance"].to_pylist(), strict=True))
            assert mine == dict(cur.fetchall()), table  # every transfer is in the cut
    assert {p: {o: t.num_rows for o, t in c.items()} for p, c in cut.items()} == expected
    for pipeline, outputs in cut.items():  # the cut is the final tables up to as_of, read from outside
        for output, table in outputs.items():
            final = [
                r for r in _delta_rows(tmp_path / "lake" / pipeline / "outputs" / output) if r["_into_ts"] <= as_of
            ]
            assert _bag(table.to_pylist()) == _bag(final), (pipeline, output)

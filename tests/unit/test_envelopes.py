"""Upsert and debezium outputs: a Delta MERGE per batch that ends where a dictionary replay ends."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.persist.asof import read_as_of
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.sources.base import Output
from reclock.testing import FakeClock, MemorySource

KV = pa.schema([("k", pa.int64()), ("v", pa.string())])


def table(lake, output: str) -> pa.Table:
    return read_table(DeltaTable(str(Lake.at(lake).output_path("p", output))))


def as_dict(t: pa.Table) -> dict[int, str]:
    return dict(zip(t.column("k").to_pylist(), t.column("v").to_pylist(), strict=True))


# Batches of (key, value-or-None); a key always goes to the same partition, as Kafka keys do.
streams = st.lists(
    st.lists(st.tuples(st.integers(0, 6), st.one_of(st.none(), st.sampled_from("abcdefg"))), max_size=12),
    min_size=1,
    max_size=5,
)


@settings(max_examples=15)  # each example runs real MERGEs; the Kafka envelope test covers the same law
@given(streams, st.sampled_from([2, 1000]))
def test_upsert_output_equals_a_dictionary_replay_of_the_stream(tmp_path_factory, batches, max_batch):
    lake = tmp_path_factory.mktemp("lake")
    source = MemorySource({"kv": Output("kv", KV, key=("k",), envelope="upsert")})
    clock = FakeClock(1000)
    pipeline = Pipeline("p", lake, source, now=clock, settings=Settings(max_batch=max_batch))
    replay: dict[int, str] = {}
    for i, batch in enumerate(batches):
        for k, v in batch:
            source.append(k % 3, "kv", [{"k": k, "v": v}])
            if v is None:
                replay.pop(k, None)
            else:
                replay[k] = v
        clock.ms = 1000 * (i + 1)
        while True:
            pipeline.step()
            if not pipeline.pending and pipeline.remap.bindings.frontier == source.upper():
                break
            clock.ms += 1
    got = table(lake, "kv")
    assert as_dict(got) == replay
    assert len(set(got.column("k").to_pylist())) == got.num_rows  # one row per key


def test_upsert_as_of_reads_show_each_key_as_it_was(tmp_path):
    source = MemorySource({"kv": Output("kv", KV, key=("k",), envelope="upsert")})
    clock = FakeClock(1000)
    pipeline = Pipeline("p", tmp_path, source, now=clock)
    for t, (k, v) in enumerate([(1, "a"), (2, "b"), (1, "c"), (2, None)], start=1):
        source.append(0, "kv", [{"k": k, "v": v}])
        clock.ms = 1000 * t
        pipeline.step()
    assert as_dict(read_as_of(tmp_path, "p", 2000)["kv"]) == {1: "a", 2: "b"}
    assert as_dict(read_as_of(tmp_path, "p", 3000)["kv"]) == {1: "c", 2: "b"}
    assert as_dict(read_as_of(tmp_path, "p", 4000)["kv"]) == {1: "c"}


def test_debezium_events_create_update_and_delete_rows(tmp_path):
    source = MemorySource({"users": Output("users", KV, key=("k",), envelope="debezium")})
    events = [
        {"before": None, "after": {"k": 1, "v": "ann"}, "op": "c"},
        {"before": None, "after": {"k": 2, "v": "bob"}, "op": "r"},
        {"before": {"k": 1, "v": "ann"}, "after": {"k": 1, "v": "anna"}, "op": "u"},
        {"before": {"k": 2, "v": "bob"}, "after": None, "op": "d"},
    ]
    source.append(0, "users", events)
    Pipeline("p", tmp_path, source, now=FakeClock(1000)).step()
    assert as_dict(table(tmp_path, "users")) == {1: "anna"}


def test_a_record_without_a_key_goes_to_errors_not_nowhere(tmp_path):
    source = MemorySource({"kv": Output("kv", KV, key=("k",), envelope="upsert")})
    source.append(0, "kv", [{"k": 1, "v": "a"}, {"k": None, "v": "lost?"}])
    Pipeline("p", tmp_path, source, now=FakeClock(1000)).step()
    assert as_dict(table(tmp_path, "kv")) == {1: "a"}
    [error] = table(tmp_path, "_errors").to_pylist()
    assert error["kind"] == "null_key" and error["_offset"] == 1


def test_replaying_a_merged_batch_changes_nothing(tmp_path):
    source = MemorySource({"kv": Output("kv", KV, key=("k",), envelope="upsert")})
    source.append(0, "kv", [{"k": 1, "v": "a"}])
    clock = FakeClock(1000)
    Pipeline("p", tmp_path, source, now=clock).step()
    path = Lake.at(tmp_path).output_path("p", "kv")
    version = DeltaTable(str(path)).version()
    restarted = Pipeline("p", tmp_path, source, now=clock)
    assert not restarted.pending and restarted.step().idle
    assert DeltaTable(str(path)).version() == version

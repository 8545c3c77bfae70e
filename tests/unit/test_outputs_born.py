"""Outputs born at a binding: a :class:`~reclock.sources.base.GrowsOutputs` source gains an output
while it runs (a Postgres table joining the publication), and the runtime gives it a sink whose
upper starts at the binding that first holds the output's partition, never at 0."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from reclock.persist.asof import read_as_of
from reclock.persist.lake import Lake, sink_id
from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.shaping import Shape
from reclock.sources.base import AwaitsOutputs, GrowsOutputs, JoinedOutput, Output
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash

CLICKS = pa.schema([("user", pa.int64())])
LATE = Output("late", pa.schema([("page", pa.string())]))


class Growing(MemorySource):
    """A memory source whose output ``late`` joins once :meth:`grow` is called, born at partition ``late-p``."""

    def __init__(self) -> None:
        super().__init__({"clicks": CLICKS})
        self._schemas["late"] = LATE.schema
        self.grown = False

    def grow(self, pages: Sequence[str]) -> None:
        self.grown = True
        self.append("late-p", "late", [{"page": p} for p in pages])

    def joined_outputs(self) -> Sequence[JoinedOutput]:
        return [JoinedOutput(LATE, "late-p")] if self.grown else []


def _labels(lake, output: str) -> list[int]:
    from deltalake import DeltaTable

    table = DeltaTable(str(Lake.at(lake).output_path("pipe", output)))
    labels = []
    for version in range(table.version() + 1):
        table.load_as_version(version)
        label = table.transaction_version(sink_id("pipe", output))
        if label is not None and (not labels or labels[-1] != label):
            labels.append(label)
    return labels


def test_an_output_that_joins_is_born_at_the_binding_holding_its_partition(tmp_path):
    clock = FakeClock(1000)
    source = Growing()
    assert isinstance(source, GrowsOutputs)
    source.append(0, "clicks", [{"user": 1}])
    pipeline = Pipeline("pipe", tmp_path, source, now=clock)
    pipeline.step()
    clock.ms = 2000
    source.grow(["a", "b"])  # joined, but its partition is bound only by the next binding
    source.append(0, "clicks", [{"user": 2}])
    assert "late" not in pipeline.sinks
    pipeline.step()
    assert pipeline.sinks["late"].upper == 2001
    assert pipeline.resume_upper == 2001  # not dragged back to 0 by the new output
    assert _labels(tmp_path, "late") == [1999, 2000]  # empty at T_join - 1, then its rows
    clock.ms = 3000
    source.append("late-p", "late", [{"page": "c"}])
    pipeline.step()
    assert read_as_of(tmp_path, "pipe", 1500)["late"].num_rows == 0
    assert read_as_of(tmp_path, "pipe", 1999)["late"].num_rows == 0
    assert read_as_of(tmp_path, "pipe", 2000)["late"].column("page").to_pylist() == ["a", "b"]
    assert sorted(read_as_of(tmp_path, "pipe", 3000)["late"].column("page").to_pylist()) == ["a", "b", "c"]


@pytest.mark.parametrize("crash", ["minted", "born:late", "committed:clicks", "committed:late"])
def test_a_crash_around_a_birth_converges(tmp_path, crash):
    clock = FakeClock(1000)
    source = Growing()
    source.append(0, "clicks", [{"user": 1}])
    Pipeline("pipe", tmp_path, source, now=clock).step()
    clock.ms = 2000
    source.grow(["a", "b"])
    with pytest.raises(SimulatedCrash):
        Pipeline("pipe", tmp_path, source, now=clock, on_step=CrashAt(crash)).step()
    clock.ms = 3000
    restarted = Pipeline("pipe", tmp_path, source, now=clock)
    assert restarted.sinks["late"].upper >= 2000  # born when the pipeline is built again
    while restarted.pending:
        restarted.step()
    assert _labels(tmp_path, "late") == [1999, 2000]
    assert sorted(read_as_of(tmp_path, "pipe", 2000)["late"].column("page").to_pylist()) == ["a", "b"]
    assert read_as_of(tmp_path, "pipe", 2000)["clicks"].num_rows == 1


#: What a definition says of ``late`` before it joins: shaped in place, routed to ``late_upper``.
LAYOUTS = {"late": OutputLayout(partition_by=("page",)), "late_upper": OutputLayout(partition_by=("shout",))}
SHAPES = [
    Shape("late", sql="SELECT page FROM input WHERE page <> 'skip'"),
    Shape("late_upper", input="late", sql="SELECT upper(page) AS shout FROM input"),
]


class Awaiting(Growing):
    """:class:`Growing` that says, before it joins, that ``late`` may join (and no other name)."""

    def may_join(self, name: str) -> bool:
        return name == "late"


def test_a_joined_output_takes_the_layout_shaping_and_routes_the_definition_awaited(tmp_path):
    from deltalake import DeltaTable

    clock = FakeClock(1000)
    source = Awaiting()
    assert isinstance(source, AwaitsOutputs)
    source.append(0, "clicks", [{"user": 1}])
    pipeline = Pipeline(
        "pipe",
        tmp_path,
        source,
        now=clock,
        layouts=LAYOUTS,
        shapes=SHAPES,
    )
    pipeline.step()
    assert "late" not in pipeline.sinks and "late_upper" not in pipeline.sinks
    clock.ms = 2000
    source.grow(["a", "skip"])
    pipeline.step()
    late = DeltaTable(str(Lake.at(tmp_path).output_path("pipe", "late")))
    assert late.metadata().partition_columns == ["page"]
    assert late.to_pyarrow_table().column("page").to_pylist() == ["a"]  # the shape's WHERE
    routed = DeltaTable(str(Lake.at(tmp_path).output_path("pipe", "late_upper")))
    assert routed.metadata().partition_columns == ["shout"]
    assert sorted(routed.to_pyarrow_table().column("shout").to_pylist()) == ["A", "SKIP"]
    assert _labels(tmp_path, "late_upper") == [1999, 2000]  # born with the output it routes
    # A restart finds them born, with the same layout and shaping.
    clock.ms = 3000
    source.append("late-p", "late", [{"page": "c"}])
    again = Pipeline(
        "pipe",
        tmp_path,
        source,
        now=clock,
        layouts=LAYOUTS,
        shapes=SHAPES,
    )
    again.step()
    assert sorted(read_as_of(tmp_path, "pipe", 3000)["late_upper"].column("shout").to_pylist()) == ["A", "C", "SKIP"]


def test_what_no_output_can_ever_be_named_is_refused_and_a_bad_awaited_layout_fails_at_the_birth(tmp_path):
    from reclock.errors import ConfigError, DefiniteSourceError

    with pytest.raises(ConfigError, match=r"^outputs\.lat: the source has no output 'lat'"):
        Pipeline("pipe", tmp_path, Awaiting(), layouts={"lat": OutputLayout(partition_by=("page",))})
    with pytest.raises(ConfigError, match=r"^outputs\.late: the source has no output 'late'"):
        Pipeline("pipe", tmp_path, Growing(), layouts={"late": OutputLayout(partition_by=("page",))})
    clock = FakeClock(1000)
    source = Awaiting()
    pipeline = Pipeline("pipe", tmp_path, source, now=clock, layouts={"late": OutputLayout(partition_by=("nope",))})
    pipeline.step()
    clock.ms = 2000
    source.grow(["a"])
    with pytest.raises(DefiniteSourceError, match=r"^outputs\.late\.partition_by: 'nope' is neither"):
        pipeline.step()
    assert not Lake.at(tmp_path).output_path("pipe", "late").exists()  # nothing of it written

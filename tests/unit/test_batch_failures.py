"""Batch failure semantics: retry whole, then stop with nothing visible or skip what failed, durably."""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pytest

from reclock.errors import TransientError
from reclock.runtime.health import Health
from reclock.runtime.pipeline import BatchFailed, BatchState, Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Settings
from reclock.testing import CrashAt, FakeClock, MemorySource, SimulatedCrash
from tests.unit.test_pipeline import tables

SCHEMAS = {"clicks": pa.schema([("user", pa.int64())])}


class PoisonSource(MemorySource):
    """Reads of ``poison`` partitions fail (bad data) while ``poisoned`` is true; transient faults too."""

    def __init__(self, poison=(), transient_faults: int = 0) -> None:
        super().__init__(SCHEMAS)
        self.poison = set(poison)
        self.poisoned = True
        self.transient_faults = transient_faults
        self.reads = 0

    def read(self, split):
        self.reads += 1
        if self.transient_faults:
            self.transient_faults -= 1
            raise TransientError("broker did not answer")
        if self.poisoned and split.partition in self.poison:
            raise ValueError(f"corrupt record in {split.partition}")
        yield from super().read(split)


def fill(source: MemorySource) -> None:
    source.append("good", "clicks", [{"user": i} for i in range(3)])
    source.append("bad", "clicks", [{"user": 100 + i} for i in range(2)])


def reports_of(pipeline: Pipeline, **kwargs):
    reports = []
    with contextlib.suppress(BatchFailed):
        pipeline.run(on_batch=reports.append, **kwargs)
    return reports


def test_failed_batch_is_retried_then_stops_with_nothing_of_it_visible(tmp_path):
    source = PoisonSource(poison={"bad"})
    fill(source)
    source.finish()
    knobs = Settings(max_retries=2, retry_backoff=0, stop_on_error=True)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs)
    reports = reports_of(pipeline)
    assert [r.state for r in reports] == [BatchState.FAILED] * 3  # the first attempt and two retries
    assert pipeline.health is Health.FAILED and "corrupt record in bad" in pipeline.last_error
    assert tables(tmp_path, "p")["clicks"] == []  # not even the good partition of the failed batch
    assert pipeline.remap.skips == []


def test_skip_policy_loads_the_rest_and_records_the_failed_range(tmp_path):
    source = PoisonSource(poison={"bad"})
    fill(source)
    source.finish()
    knobs = Settings(max_retries=1, retry_backoff=0, stop_on_error=False)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs)
    reports = reports_of(pipeline)
    assert pipeline.finished and pipeline.health is Health.STOPPED
    assert [r.state for r in reports][:2] == [BatchState.FAILED, BatchState.FAILED]
    got = tables(tmp_path, "p")
    assert [r["user"] for r in got["clicks"]] == [0, 1, 2]
    [error] = got["_errors"]
    assert error["kind"] == "skipped" and error["_partition"] == "bad" and error["_offset"] == 0
    assert "offsets [0, 2)" in error["message"] and "corrupt record in bad" in error["message"]
    [skip] = pipeline.remap.skips
    assert (skip.partition, skip.start, skip.end) == ("bad", 0, 2)


def test_a_skip_decision_survives_a_crash_and_is_never_reversed(tmp_path):
    source = PoisonSource(poison={"bad"})
    fill(source)
    knobs = Settings(max_retries=0, retry_backoff=0, stop_on_error=False)
    crash = CrashAt("written", nth=1)  # the first batch that gets as far as writing: after the skip
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs, on_step=crash)
    with pytest.raises(SimulatedCrash):
        pipeline.run()
    assert len(pipeline.remap.skips) == 1 and tables(tmp_path, "p")["clicks"] == []
    source.poisoned = False  # the data would read fine now, but the range was given up durably
    source.finish()
    restarted = Pipeline("p", tmp_path, source, now=FakeClock(2000), settings=knobs)
    restarted.run()
    got = tables(tmp_path, "p")
    assert sorted(r["user"] for r in got["clicks"]) == [0, 1, 2]
    assert [e["_partition"] for e in got["_errors"]] == ["bad"]


def test_transient_faults_stall_and_retry_without_ever_skipping(tmp_path):
    source = PoisonSource(transient_faults=5)
    fill(source)
    source.finish()
    knobs = Settings(max_retries=1, retry_backoff=0, stop_on_error=False)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs)
    healths = []
    pipeline.run(on_batch=lambda r: healths.append(pipeline.health))
    assert pipeline.finished and pipeline.remap.skips == []
    assert Health.STALLED in healths
    assert len(tables(tmp_path, "p")["clicks"]) == 5


def test_a_later_batch_continues_after_a_skip(tmp_path):
    source = PoisonSource(poison={"bad"})
    fill(source)
    clock = FakeClock(1000)
    knobs = Settings(max_retries=0, retry_backoff=0, stop_on_error=False)
    pipeline = Pipeline("p", tmp_path, source, now=clock, settings=knobs)
    with pytest.raises(BatchFailed):
        pipeline.step()
    source.append("good", "clicks", [{"user": 7}])
    source.finish()
    pipeline.run()
    assert sorted(r["user"] for r in tables(tmp_path, "p")["clicks"]) == [0, 1, 2, 7]


class FlakyProbeSource(MemorySource):
    """The probe fails ``outages`` times, as a Kafka source's does while the broker is away."""

    def __init__(self, outages: int) -> None:
        super().__init__(SCHEMAS)
        self.outages = outages

    def upper(self):
        if self.outages:
            self.outages -= 1
            raise TransientError("metadata request timed out")
        return super().upper()


def test_a_probe_outage_is_reported_as_stalled_with_the_error_then_running(tmp_path):
    source = FlakyProbeSource(outages=3)
    fill(source)
    source.finish()
    seen = []
    knobs = Settings(max_retries=0, retry_backoff=0)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs)
    pipeline.run(on_health=lambda p: seen.append((p.health, p.last_error)))
    assert seen[:3] == [(Health.STALLED, "TransientError: metadata request timed out")] * 3
    assert (Health.RUNNING, None) in seen and seen[-1] == (Health.STOPPED, None)
    assert pipeline.finished and len(tables(tmp_path, "p")["clicks"]) == 5


def test_a_batch_some_output_already_holds_is_never_skipped_it_fails_instead(tmp_path):
    """Crash between two outputs' commits, then the range turns unreadable: a skip would make the
    rows that already landed *also* a skipped range in ``_errors`` (both), so the pipeline fails."""
    source = PoisonSource(poison={"bad"})
    source.poisoned = False
    fill(source)
    source.finish()
    clock = FakeClock(1000)
    crashing = Pipeline("p", tmp_path, source, now=clock, on_step=CrashAt("committed:clicks"))
    with pytest.raises(SimulatedCrash):
        crashing.step()
    landed = tables(tmp_path, "p")
    assert len(landed["clicks"]) == 5 and landed["_errors"] == []  # clicks holds the batch, _errors not
    source.poisoned = True
    knobs = Settings(max_retries=0, retry_backoff=0, stop_on_error=False)
    restarted = Pipeline("p", tmp_path, source, now=clock, settings=knobs)
    with pytest.raises(BatchFailed):
        restarted.run()
    assert restarted.health is Health.FAILED
    assert "already holds" in restarted.last_error
    after = tables(tmp_path, "p")
    assert after["_errors"] == [] and after["clicks"] == landed["clicks"]
    assert restarted.remap.skips == []


class LastFirstPlane(LocalDataPlane):
    """A data plane that returns its results as tasks might finish: the last split first."""

    def run(self, plan, splits):
        return super().run(plan, splits)[::-1]


def test_a_failed_batch_names_its_first_failed_split_in_the_sources_order(tmp_path):
    source = PoisonSource(poison={"a", "b"})
    source.append("a", "clicks", [{"user": 1}])
    source.append("b", "clicks", [{"user": 2}])
    source.append("c", "clicks", [{"user": 3}])
    knobs = Settings(max_retries=0, retry_backoff=0, stop_on_error=True)
    pipeline = Pipeline("p", tmp_path, source, data_plane=LastFirstPlane(), now=FakeClock(1000), settings=knobs)
    with pytest.raises(BatchFailed, match=r"2 of 3 splits failed; first: partition a offsets \[0, 1\)") as failed:
        pipeline.step()
    assert [r.split.partition for r in failed.value.report.results] == ["a", "b", "c"]


class SelfNamedError(Exception):
    """Like kafka-python's errors, whose message already starts with their type."""

    def __str__(self) -> str:
        return f"{type(self).__name__}: {super().__str__()}"


class SelfNamedFailure(MemorySource):
    def read(self, split):
        raise SelfNamedError("Unable to bootstrap")


def test_an_error_whose_message_names_its_type_is_reported_with_the_type_once(tmp_path):
    source = SelfNamedFailure(SCHEMAS)
    source.append("a", "clicks", [{"user": 1}])
    knobs = Settings(max_retries=0, retry_backoff=0, stop_on_error=True)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs)
    with pytest.raises(BatchFailed) as failed:
        pipeline.run()
    assert failed.value.report.results[0].error == "SelfNamedError: Unable to bootstrap"
    assert pipeline.last_error.count("SelfNamedError") == 1


class RogueSource(MemorySource):
    """Yields rows for an output it never declared: a broken source, not bad data."""

    def read(self, split):
        for output, batch in super().read(split):
            yield "undeclared", batch
            yield output, batch


def test_a_source_breaking_its_contract_fails_the_pipeline_even_when_skipping_is_allowed(tmp_path):
    source = RogueSource(SCHEMAS)
    fill(source)
    source.finish()
    knobs = Settings(max_retries=3, retry_backoff=0, stop_on_error=False)
    pipeline = Pipeline("p", tmp_path, source, now=FakeClock(1000), settings=knobs)
    reports = reports_of(pipeline)
    assert [r.state for r in reports] == [BatchState.FAILED]  # no retries, no skip: a bug fails at once
    assert pipeline.health is Health.FAILED
    assert "ContractError: source yielded rows for unknown output 'undeclared'" in pipeline.last_error
    assert pipeline.remap.skips == [] and tables(tmp_path, "p")["clicks"] == []

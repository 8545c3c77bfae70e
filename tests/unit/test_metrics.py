"""Metrics of a real pipeline over a real lake, read back through Prometheus's own text parser."""

from __future__ import annotations

import urllib.request

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from reclock.errors import ConfigError
from reclock.job.config import parse_config
from reclock.job.metrics import Metrics
from reclock.persist.asof import CLOSED_UPPER
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Settings
from reclock.testing import FakeClock, MemorySource
from tests.waiting import PATIENCE_S


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def two_partitions(max_batch: int = 1_000_000) -> tuple[Pipeline, MemorySource, FakeClock]:
    source = MemorySource({"clicks": pa.schema([("user", pa.int64())])})
    source.append(0, "clicks", [{"user": i} for i in range(5)])
    source.append(1, "clicks", [{"user": i} for i in range(3)])
    clock = FakeClock(10_000)
    return Pipeline("p", "lake", source, settings=Settings(max_batch=max_batch), now=clock), source, clock


def test_histograms_count_batches_and_measure_latency_from_the_into_time_to_the_commit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pipeline, _, clock = two_partitions()
    report = pipeline.step()
    metrics = Metrics(pipeline, now=lambda: report.binding_ts + 1_500)
    metrics.observe(report)
    got = samples(metrics.render())
    p = (("pipeline", "p"),)
    assert got[("reclock_batch_duration_seconds_count", p)] == 1
    assert got[("reclock_batch_duration_seconds_sum", p)] == report.duration_ms / 1000
    assert got[("reclock_visible_latency_seconds_count", p)] == 1
    assert got[("reclock_visible_latency_seconds_sum", p)] == 1.5
    assert got[("reclock_visible_latency_seconds_bucket", (("le", "1.0"), *p))] == 0
    assert got[("reclock_visible_latency_seconds_bucket", (("le", "2.5"), *p))] == 1
    assert got[("reclock_rows_total", (("output", "clicks"), *p))] == 8
    assert clock() == 10_000  # the pipeline's clock was not the latency's


def test_gauges_show_each_outputs_upper_the_readable_upper_and_lag_per_partition(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pipeline, source, _ = two_partitions(max_batch=4)
    metrics = Metrics(pipeline)
    metrics.observe(pipeline.step())  # capped at 4 of the 8 offsets
    got = samples(metrics.render())
    p = (("pipeline", "p"),)
    resume = pipeline.resume_frontier()
    lags = {part: got[("reclock_partition_lag_offsets", (("partition", part), *p))] for part in ("0", "1")}
    assert lags == {"0": 5 - resume.offset(0), "1": 3 - resume.offset(1)}
    assert sum(lags.values()) == got[("reclock_lag_offsets", p)] == 4
    for output, sink in pipeline.sinks.items():
        assert got[("reclock_output_upper_ms", (("output", output), *p))] == sink.upper > 0
    assert got[("reclock_readable_upper_ms", p)] == pipeline.resume_upper

    source.finish()
    while not pipeline.finished:
        metrics.observe(pipeline.step())
    got = samples(metrics.render())
    assert got[("reclock_readable_upper_ms", p)] == float(CLOSED_UPPER)  # exposition values are doubles
    assert got[("reclock_partition_lag_offsets", (("partition", "0"), *p))] == 0


def test_two_pipelines_in_one_process_keep_their_own_series_and_process_metrics(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, _, _ = two_partitions()
    second_source = MemorySource({"clicks": pa.schema([("user", pa.int64())])})
    second_source.append(0, "clicks", [{"user": 1}])
    second = Pipeline("q", "lake", second_source, now=FakeClock(10_000))
    one, two = Metrics(first), Metrics(second)
    one.observe(first.step())
    two.observe(second.step())
    got_one, got_two = samples(one.render()), samples(two.render())
    assert got_one[("reclock_rows_total", (("output", "clicks"), ("pipeline", "p")))] == 8
    assert got_two[("reclock_rows_total", (("output", "clicks"), ("pipeline", "q")))] == 1
    assert not any(labels and ("pipeline", "q") in labels for _, labels in got_one)
    for got in (got_one, got_two):
        assert got[("process_cpu_seconds_total", ())] > 0
        assert got[("process_resident_memory_bytes", ())] > 0
        assert any(name == "python_gc_collections_total" for name, _ in got)


def test_the_endpoint_binds_to_the_configured_host(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pipeline, _, _ = two_partitions()
    metrics = Metrics(pipeline)
    metrics.observe(pipeline.step())
    port = metrics.serve(0, "127.0.0.1")
    try:
        assert metrics._server.server_address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S).read().decode()
    finally:
        metrics.close()
    assert samples(body)[("reclock_batches_total", (("pipeline", "p"), ("state", "Succeeded")))] == 1


def test_metrics_host_is_a_config_key_defaulting_to_loopback_and_stored_only_when_set():
    base = {"pipeline": {"name": "p", "metrics_port": 9464}, "source": {"kind": "generator"}}
    config = parse_config(base)
    assert config.metrics_host == "127.0.0.1" and "metrics_host" not in config.to_dict()["pipeline"]
    opened = parse_config({**base, "pipeline": {**base["pipeline"], "metrics_host": "0.0.0.0"}})
    assert opened.metrics_host == "0.0.0.0" and opened.to_dict()["pipeline"]["metrics_host"] == "0.0.0.0"
    try:
        parse_config({**base, "pipeline": {**base["pipeline"], "metrics_host": " "}})
    except ConfigError as exc:
        assert exc.field == "pipeline.metrics_host"
    else:
        raise AssertionError("an empty metrics_host was accepted")

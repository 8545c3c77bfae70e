"""The Grafana dashboard and the alert rules of deploy/grafana/ name only metrics a job exports.

A running job (``reclock start`` in a subprocess, a generator pipeline with ``metrics_port = 0``)
is scraped on its live ``/metrics``; every PromQL expression of the dashboard and of the alert
rules is parsed for the metric names it selects, and each must be one of the scrape's series.
A renamed metric, or a query written for a metric that does not exist, fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from reclock.cli.main import main
from tests import zygote
from tests.waiting import PATIENCE_S

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "reclock.json"
ALERTS = ROOT / "deploy" / "grafana" / "alerts.yml"

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions (followed
    by ``(``), keywords, label names (inside ``{}`` or a ``by (...)`` clause), ranges or strings."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![A-Za-z0-9_.$])[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("(") or match.group() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def test_metric_names_reads_promql_as_prometheus_does():
    assert metric_names('sum by (pipeline) (rate(reclock_rows_total{pipeline=~"$p"}[$__rate_interval]))') == {
        "reclock_rows_total"
    }
    assert metric_names("(time() * 1000 - a_ms) / 1000 > 3e2 and b < 9e18") == {"a_ms", "b"}
    assert metric_names('topk(8, x{partition="p"}) or on (pipeline) y') == {"x", "y"}


def _expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(re.sub(r"label_values\((\w+),.*\)", r"\1", variable["definition"]))
    rules = yaml.safe_load(ALERTS.read_text())
    exprs += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return exprs


@pytest.mark.usefixtures("reclock_processes")
def test_every_dashboard_and_alert_query_names_only_metrics_a_running_job_exports(tmp_path):
    config = tmp_path / "m.toml"
    config.write_text(
        '[pipeline]\nname = "metered"\nlake = "lake"\nengine = "local"\nmetrics_port = 0\nbatch_interval = 0.2\n'
        'max_batch = 500\n[source]\nkind = "generator"\npartitions = 2\nrate = 2000\n'
    )
    assert main(["create", str(config)]) == 0
    lake = tmp_path / "lake"
    job = zygote.popen(
        ["--lake", str(lake), "start", "metered"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status_path = lake / "metered" / "status.json"
        deadline = time.monotonic() + 60
        status: dict = {}
        while not (status.get("batches", 0) >= 2 and status.get("metrics_port")):
            assert time.monotonic() < deadline and job.poll() is None, "the job never served its metrics"
            time.sleep(0.1)
            status = json.loads(status_path.read_text()) if status_path.exists() else {}
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{status['metrics_port']}/metrics", timeout=PATIENCE_S).read()
    finally:
        assert main(["--lake", str(lake), "stop", "metered"]) == 0
        job.wait(timeout=60)
    exported = {s.name for family in text_string_to_metric_families(scrape.decode()) for s in family.samples}
    exprs = _expressions()
    assert len(exprs) >= 15
    named = set().union(*(metric_names(e) for e in exprs))
    assert named and named <= exported, sorted(named - exported)
    # Every series the page's charts draw from has its panel: rows, batches, durations, lag, uppers, health.
    assert {
        "reclock_rows_total",
        "reclock_batches_total",
        "reclock_batch_duration_seconds_bucket",
        "reclock_partition_lag_offsets",
        "reclock_lag_offsets",
        "reclock_readable_upper_ms",
        "reclock_output_upper_ms",
        "reclock_health",
    } <= named

"""A third-party source as a plugin: pip-installed, then run by the ``reclock`` CLI like a built-in.

The plugin is ``tests/plugins/sensorlog``, the example of ``docs/source-authors.md``, installed by
pip into a fresh environment (the ``plugin_python`` fixture, see :mod:`tests.integration.envs`),
where the entry point is real distribution metadata. The guide's own commands run there, in a
shell, and what landed in the lake is checked from outside: the Delta logs replayed by
``tests.faults.reader`` and the rows read with pyarrow, against what the test wrote into the log
files and parses itself.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.envs import ROOT, clean_env
from tests.integration.helpers import assert_rows_exactly_once, sensorlog_rows
from tests.waiting import PATIENCE_S

PLUGIN = ROOT / "tests" / "plugins" / "sensorlog"
GUIDE = ROOT / "docs" / "source-authors.md"
MARKER = re.compile(r"^<!-- plugin: (\S+) -->\s*$")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}")


def guide_blocks() -> dict[str, str]:
    """The fenced block after each ``<!-- plugin: NAME -->`` marker of the guide, by NAME."""
    lines = GUIDE.read_text().splitlines(keepends=True)
    blocks = {}
    for i, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker:
            assert lines[i + 1].startswith("```"), f"{GUIDE.name}:{i + 2}: a fence must follow the marker"
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            blocks[marker.group(1)] = "".join(lines[i + 2 : end])
    return blocks


def shell(script: str, python: Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = clean_env(PATH=f"{python.parent}:{clean_env()['PATH']}")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_guides_plugin_files_are_the_packaged_plugin():
    blocks = guide_blocks()
    assert blocks["pyproject.toml"] == (PLUGIN / "pyproject.toml").read_text()
    assert blocks["sensorlog/source.py"] == (PLUGIN / "sensorlog" / "source.py").read_text()


def test_the_guides_commands_run_the_plugin_and_print_the_shown_status(plugin_python, tmp_path):
    blocks = guide_blocks()
    (tmp_path / "sensors.toml").write_text(blocks["sensors.toml"])
    shutil.copytree(PLUGIN, tmp_path / "sensorlog")  # "./sensorlog", the folder the guide installs
    done = shell(blocks["commands"], plugin_python, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    status = done.stdout[done.stdout.index("pipeline  health") :]  # after create's line and start's progress
    assert STAMP.sub("<time>", status) == STAMP.sub("<time>", blocks["output"])
    assert_rows_exactly_once(tmp_path / "lake", "sensors", sensorlog_rows(tmp_path / "logs"))

    bad = (tmp_path / "sensors.toml").read_text() + "max_split_offsets = 0\n"
    (tmp_path / "sensors.toml").write_text(bad)
    refused = shell("reclock create sensors.toml", plugin_python, tmp_path)
    shown = next(line for line in GUIDE.read_text().splitlines() if "source.max_split_offsets" in line)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == shown + "\n"  # one line, no traceback, as the guide shows it


def test_a_running_plugin_pipeline_has_status_tables_metrics_stop_and_resume(plugin_python, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "north.jsonl").write_text("".join(json.dumps({"sensor": "n1", "c": i / 2}) + "\n" for i in range(50)))
    (tmp_path / "sensors.toml").write_text(
        '[pipeline]\nname = "tail"\nlake = "lake"\nengine = "local"\nbatch_interval = 0.1\nmetrics_port = 0\n'
        f'[source]\nkind = "sensorlog"\npath = "{logs}"\nmax_split_offsets = 7\n'
    )
    assert shell("reclock create sensors.toml", plugin_python, tmp_path).returncode == 0
    env = clean_env(PATH=f"{plugin_python.parent}:{clean_env()['PATH']}")
    job = subprocess.Popen(["reclock", "start", "tail"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    status_path = tmp_path / "lake" / "tail" / "status.json"
    status: dict = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and status.get("rows", {}).get("readings", 0) < 50:
        time.sleep(0.1)
        status = json.loads(status_path.read_text()) if status_path.exists() else {}
    assert status.get("rows", {}).get("readings") == 50, status
    with urllib.request.urlopen(f"http://127.0.0.1:{status['metrics_port']}/metrics", timeout=PATIENCE_S) as answer:
        metrics = answer.read().decode()
    rows = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "reclock_rows_total"
    }
    assert rows[(("output", "readings"), ("pipeline", "tail"))] == 50
    with open(logs / "north.jsonl", "a") as f:  # a half-written line is not data yet
        f.write('{"sensor": "n1", "alert": "door open"}\n{"sensor": "n1", "c": 9')
    (logs / "south.jsonl").write_text('{"sensor": "s1", "c": 1.0}\n{"sensor": \n')
    assert shell("reclock stop tail --wait 60", plugin_python, tmp_path).returncode == 0
    assert job.wait(timeout=60) == 0, job.stderr.read()[-3000:]

    with open(logs / "north.jsonl", "a") as f:
        f.write(".5}\n")
    (logs / "END").touch()
    done = shell("reclock start tail", plugin_python, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    batches = json.loads(shell("reclock batches tail --limit 0 --json", plugin_python, tmp_path).stdout)
    assert {b["partition"] for b in batches if b["state"] == "Succeeded"} == {"north", "south"}
    shown = shell("reclock status tail", plugin_python, tmp_path).stdout
    assert re.search(r"^tail +stopped +yes ", shown, re.MULTILINE), shown
    expected = sensorlog_rows(logs)
    assert len(expected["readings"]) == 52 and len(expected["alerts"]) == 1 and len(expected["_errors"]) == 1
    assert_rows_exactly_once(tmp_path / "lake", "tail", expected)

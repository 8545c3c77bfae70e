"""The status page's data and server over a real lake, without a browser.

Real jobs (``reclock start`` in process) fill a local lake; the page's answers are compared with
what the lake says through reclock's own readers: :func:`~reclock.persist.asof.latest_cut` for the
timeline's joint cut in every case it distinguishes (all finished, one lagging, one never run),
``reclock status --json`` for states and uppers, the batches table for the charts.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from reclock.persist.asof import CLOSED_UPPER, latest_cut
from reclock.persist.lake import Lake
from reclock.ui import views
from reclock.ui.lake_view import LakeView
from reclock.ui.server import StatusPage
from tests.cli import reclock_in_process
from tests.waiting import PATIENCE_S


def _create(tmp_path: Path, name: str, source: str) -> None:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'[pipeline]\nname = "{name}"\nlake = "lake"\nengine = "local"\nbatch_interval = 0.05\nmax_batch = 400\n'
        f'[source]\nkind = "generator"\npartitions = 2\n{source}\n'
    )
    assert reclock_in_process("create", str(config)).returncode == 0


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """``done`` (bounded, finished), ``open`` (unbounded, stopped), ``detached`` and ``fresh`` (never run)."""
    tmp_path = tmp_path_factory.mktemp("ui")
    _create(tmp_path, "done", "limit = 2000")
    _create(tmp_path, "open", "rate = 4000")
    _create(tmp_path, "gone", "rate = 4000")
    _create(tmp_path, "fresh", "rate = 10")
    lake = tmp_path / "lake"
    for name, seconds in (("done", "30"), ("open", "1.5"), ("gone", "1")):
        assert reclock_in_process("--lake", str(lake), "start", name, "--max-seconds", seconds).returncode == 0
    assert reclock_in_process("--lake", str(lake), "detach", "gone").returncode == 0
    return lake


def _status(lake: Path) -> dict[str, dict]:
    shown = reclock_in_process("--lake", str(lake), "status", "--json")
    return {row["pipeline"]: row for row in json.loads(shown.stdout)}


def test_the_overview_says_each_pipelines_state_and_readable_upper_as_status_does(lake):
    snap = LakeView(Lake.at(lake)).refresh()
    rows = {row["name"]: row for row in views.overview(snap)["pipelines"]}
    status = _status(lake)
    assert {name: row["state"] for name, row in rows.items()} == {
        "done": "finished",
        "open": "stopped",
        "gone": "detached",
        "fresh": "created",
    }
    for name, row in rows.items():
        assert row["readable_upper"] == (status[name]["readable_upper"] or 0), name
        assert row["outputs"] == status[name]["outputs"], name
        assert row["source"] == "generator"
    assert rows["done"]["freshness_ms"] == 0 and rows["fresh"]["freshness_ms"] is None
    assert rows["open"]["freshness_ms"] == snap.taken_ms - status["open"]["readable_upper"]
    assert rows["open"]["error"] is None and "reclock start open" in rows["open"]["hint"]


@pytest.mark.parametrize(
    "names",
    [["done"], ["open"], ["done", "open"], ["open", "gone", "done"], ["fresh", "open"]],
    ids=lambda names: "+".join(names),
)
def test_the_timelines_joint_cut_is_latest_cut_and_names_who_holds_it_back(lake, names):
    snap = LakeView(Lake.at(lake)).refresh()
    cut = views.timeline(snap, names, str(lake))["cut"]
    assert cut["as_of"] == latest_cut(lake, names)
    uppers = {name: snap.pipelines[name].readable_upper for name in names}
    if all(u == CLOSED_UPPER for u in uppers.values()):
        assert cut["held_back_by"] is None
    else:
        assert cut["held_back_by"]["pipeline"] == min(uppers, key=lambda n: uppers[n])
    assert f"as-of {' '.join(names)} --at {cut['as_of']}" in cut["recipes"]["cli"]


def test_the_charts_are_the_batches_table_and_their_last_point_the_readable_upper(lake):
    snap = LakeView(Lake.at(lake)).refresh()
    series = views.series(snap, "open")
    batches = [r for r in views.table(snap, "open", "batches", limit=100_000)["rows"] if r["state"] == "Succeeded"]
    assert sum(series["rows"]["rows"]) == sum(r["rows"] for r in batches)
    assert series["freshness"]["readable_upper"][-1] == _status(lake)["open"]["readable_upper"]
    assert series["freshness"]["t"][-1] == snap.taken_ms / 1000
    assert set(series["lag"]["partitions"]) == {"gen-0", "gen-1"}
    assert len(series["phases"]["commit"]) == len(series["rows"]["rows"]) > 0


def test_tables_page_and_filter_newest_first(lake):
    snap = LakeView(Lake.at(lake)).refresh()
    everything = views.table(snap, "open", "batches", limit=100_000)
    page = views.table(snap, "open", "batches", offset=2, limit=3)
    assert page["total"] == everything["total"] and page["rows"] == everything["rows"][2:5]
    times = [r["time_ms"] for r in everything["rows"]]
    assert times == sorted(times, reverse=True)
    gen1 = views.table(snap, "open", "batches", limit=100_000, where={"partition": "gen-1"})
    assert gen1["rows"] and all(r["partition"] == "gen-1" for r in gen1["rows"])
    offsets = views.table(snap, "open", "offsets")["rows"]
    assert [r["partition"] for r in offsets] == ["gen-0", "gen-1"] and all(r["lag"] is not None for r in offsets)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=PATIENCE_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_server_binds_loopback_serves_its_files_and_nothing_else(lake):
    page = StatusPage(Lake.at(lake)).start()
    try:
        assert page.httpd.server_address[0] == "127.0.0.1"
        assert _get(page.url)[1].startswith("<!doctype html>")
        assert "uPlot" in _get(page.url + "static/uPlot.iife.min.js")[1]
        assert _get(page.url + "static/..%2F__init__.py")[0] == 404
        assert _get(page.url + "static/../server.py")[0] == 404
        assert _get(page.url + "api/nope")[0] == 404
        assert _get(page.url + "api/pipelines/nope/series")[0] == 404
        status, body = _get(page.url + "api/overview")
        assert status == 200 and {p["name"] for p in json.loads(body)["pipelines"]} == {"done", "open", "gone", "fresh"}
    finally:
        page.close()


def test_a_port_in_use_is_one_line_naming_it(lake):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = reclock_in_process("--lake", str(lake), "ui", "--port", str(port))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in refused.stderr, refused.stderr

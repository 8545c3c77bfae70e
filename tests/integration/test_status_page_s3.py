"""``reclock ui`` over a lake in S3 (moto's server): the page works, and the lake's keys never show.

The storage options carry the S3 secret key; the page's server holds them to read the lake, and
no answer of it (page, script, any JSON endpoint, its first line, its stderr) may carry the key.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request

from reclock.persist.asof import latest_cut
from tests import zygote
from tests.cli import reclock_in_process
from tests.integration.helpers import write_config
from tests.waiting import PATIENCE_S


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=PATIENCE_S) as response:
        return response.read().decode()


def test_the_page_over_an_s3_lake_shows_its_pipeline_and_never_its_keys(s3_server, tmp_path, reclock_processes):
    lake = f"s3://{s3_server.bucket()}/lake"
    options = [f"--storage-option={k}={v}" for k, v in s3_server.storage_options.items()]
    config = write_config(
        tmp_path / "g.toml",
        pipeline={"name": "bounded", "lake": lake, "engine": "local", "batch_interval": 0.05, "max_batch": 500},
        source={"kind": "generator", "partitions": 2, "limit": 1500},
    )
    assert reclock_in_process(*options, "create", str(config)).returncode == 0
    started = reclock_in_process(*options, "--lake", lake, "start", "bounded", "--max-seconds", "60")
    assert started.returncode == 0, started.stderr
    ui = zygote.popen(
        [*options, "--lake", lake, "ui", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        url = line.split(" on ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        bodies = [line, _get(url), _get(url + "static/app.js"), _get(url + "api/overview")]
        timeline = _get(url + "api/timeline")
        bodies.append(timeline)
        for path in ("series", "definition", "tables/batches", "tables/errors", "tables/files", "tables/offsets"):
            bodies.append(_get(f"{url}api/pipelines/bounded/{path}"))
    finally:
        ui.terminate()
        _, err = ui.communicate(timeout=PATIENCE_S)
    overview = json.loads(bodies[3])
    assert [(p["name"], p["state"]) for p in overview["pipelines"]] == [("bounded", "finished")]
    assert json.loads(timeline)["cut"]["as_of"] == latest_cut(
        lake, ["bounded"], storage_options=s3_server.storage_options
    )
    for body in [*bodies, err]:
        assert s3_server.secret_access_key not in body

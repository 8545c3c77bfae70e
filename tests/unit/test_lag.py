"""One definition of lag (issue 24): the progress line, ``/metrics`` and ``reclock offsets`` agree.

Each test runs a real job in this process (:func:`reclock.job.lifecycle.run`) with metrics served
on a free port, and looks from inside the job's own progress view: while the view draws a
snapshot the job waits, so the snapshot, a scrape of ``/metrics`` and ``reclock offsets`` all see
one state of the lake. The scrape and ``reclock offsets`` go through their real paths (HTTP, the
CLI), not through the job's objects.
"""

from __future__ import annotations

import io
import json
import re
import urllib.request
from typing import TYPE_CHECKING

from reclock.job import lifecycle
from reclock.job.status import read_status
from reclock.persist.lake import Lake
from tests.cli import reclock_in_process
from tests.waiting import PATIENCE_S, run_until

if TYPE_CHECKING:
    from reclock.job.progress import JobProgress

DEFINITION = """
[pipeline]
name = "lagging"
lake = "{lake}"
engine = "local"
metrics_port = 0
{pipeline}

[source]
kind = "generator"
partitions = 2
{source}
"""


class Looking:
    """A progress view that, at each snapshot, scrapes ``/metrics`` and asks ``reclock offsets``."""

    def __init__(self, lake: Lake, stop_after: int | None = None) -> None:
        self.lake = lake
        self.stop_after = stop_after
        self.seen: list[tuple[JobProgress, float, dict[str, float], dict[str, int]]] = []

    def show(self, progress: JobProgress) -> None:
        port = read_status(self.lake, "lagging")["metrics_port"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S).read().decode()
        total = float(re.search(r'^reclock_lag_offsets\{pipeline="lagging"\} (\S+)$', text, re.M).group(1))
        per = {
            m.group(1).replace('\\"', '"').replace("\\\\", "\\"): float(m.group(2))
            for m in re.finditer(
                r'^reclock_partition_lag_offsets\{partition="(.*?)",pipeline="lagging"\} (\S+)$', text, re.M
            )
        }
        shown = reclock_in_process("--lake", str(self.lake.root), "offsets", "lagging", "--json")
        assert shown.returncode == 0, shown.stderr
        offsets = {r["partition"]: r["lag"] for r in json.loads(shown.stdout)}
        self.seen.append((progress, total, per, offsets))
        if self.stop_after is not None and len(self.seen) >= self.stop_after:
            lifecycle.request_stop(self.lake, "lagging")

    def close(self) -> None:
        pass


def job(tmp_path, view_stop_after: int | None, *, pipeline: str, source: str, max_seconds: float | None = None):
    lake = tmp_path / "lake"
    path = tmp_path / "lagging.toml"
    path.write_text(DEFINITION.format(lake=lake, pipeline=pipeline, source=source))
    assert reclock_in_process("create", str(path)).returncode == 0
    view = Looking(Lake.at(str(lake)), view_stop_after)
    pipeline_ = lifecycle.run(view.lake, "lagging", progress=view, max_seconds=max_seconds)
    return view, pipeline_


def test_a_backlog_shows_one_lag_in_the_progress_line_the_metrics_and_reclock_offsets(tmp_path):
    """A bounded backlog drained in capped batches: the source's upper holds still, so all three
    must be the same number at each snapshot, per partition too."""
    view, pipeline = job(tmp_path, 3, pipeline="max_batch = 3000", source="limit = 30000")
    assert len(view.seen) >= 3
    for progress, total, per, offsets in view.seen:
        assert progress.lag is not None and progress.lag > 0, progress
        assert total == progress.lag == sum(offsets.values()), (progress, total, offsets)
        assert per == offsets, (per, offsets)
        assert progress.loaded + progress.lag == 30_000  # the bar's total: the whole snapshot
    assert not pipeline.finished


def test_the_progress_line_shows_what_arrived_while_a_batch_ran_not_zero(tmp_path):
    """A live source, uncapped batches: each batch takes all it probed, so the lag right after its
    commit is 0 by construction (the demo's lines all read 0 while ``reclock offsets`` showed
    thousands). The line is drawn after the next probe, and shows what arrived meanwhile."""
    lake = tmp_path / "lake"
    path = tmp_path / "lagging.toml"
    path.write_text(DEFINITION.format(lake=lake, pipeline="", source="rate = 40000").replace("metrics_port = 0", ""))
    assert reclock_in_process("create", str(path)).returncode == 0
    out = io.StringIO()
    run_until(  # three progress lines, however long the machine takes over them
        Lake.at(str(lake)),
        "lagging",
        lambda: len(re.findall(r" lag +\d+ ", out.getvalue())) >= 3,
        "three lag lines",
        progress=out,
    )
    lags = [int(lag) for lag in re.findall(r" lag +(\d+) ", out.getvalue())]
    assert len(lags) >= 3, out.getvalue()
    assert sum(1 for lag in lags if lag) >= len(lags) - 1, out.getvalue()  # the last may follow no probe

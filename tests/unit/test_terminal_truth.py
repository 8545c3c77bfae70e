"""What the terminal says is what happened (issue 24): one line naming the cause and the fix, a
status that says the same, an exit status that tells success from failure.

Every command runs in this process (:func:`tests.cli.reclock_in_process`); none of these tests
starts a JVM: a Spark master that cannot be reached is refused before Spark is started.
"""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time

import pytest

from reclock.job.status import read_status
from reclock.persist.lake import Lake
from tests.cli import reclock_in_process
from tests.waiting import PATIENCE_S, run_until

GENERATOR = """
[pipeline]
name = "{name}"
lake = "{lake}"
engine = "{engine}"
max_batch = 2000

[source]
kind = "generator"
partitions = 2
limit = {limit}
"""


def created(tmp_path, name: str = "orders", *, engine: str = "local", limit: int = 4000, extra: str = "") -> str:
    """Create a generator pipeline in ``tmp_path/lake``; its lake's path."""
    lake = tmp_path / "lake"
    path = tmp_path / f"{name}.toml"
    path.write_text(GENERATOR.format(name=name, lake=lake, engine=engine, limit=limit) + extra)
    result = reclock_in_process("create", str(path))
    assert result.returncode == 0, result.stderr
    return str(lake)


def status_of(lake: str, name: str) -> dict:
    result = reclock_in_process("--lake", lake, "status", name, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[0]


@pytest.mark.parametrize("background", [False, True])
def test_an_unreachable_spark_master_is_one_line_at_once_and_the_status_says_so(tmp_path, background):
    spark = f'\n[spark]\nmaster = "spark://127.0.0.1:1"\nbackground_start = {str(background).lower()}\n'
    lake = created(tmp_path, engine="spark", extra=spark)
    result = reclock_in_process("--lake", lake, "start", "orders")
    assert result.returncode == 1, result
    # At once: said by the connect that refuses the master before Spark starts (its message, no
    # Java in it), not after Spark's minute of retries, whatever time a loaded machine takes.
    lines = result.stderr.strip().splitlines()
    # Waiting for the session: the failure. In the background: a warning at once, then the failure.
    assert len(lines) == 1 + background, result.stderr
    for line in lines:
        assert "spark://127.0.0.1:1" in line and 'engine = "local"' in line, line
        assert "Traceback" not in line and "java" not in line.lower() and "py4j" not in line.lower(), line
    status = status_of(lake, "orders")
    assert status["health"] == "failed", status
    assert "cannot reach the Spark master 'spark://127.0.0.1:1'" in status["last_error"], status


def test_a_spark_session_that_does_not_start_in_time_fails_the_next_batch_naming_the_setting(caplog):
    """A master that accepts connections and never answers makes Spark wait a minute or more; the
    plane gives up after ``[spark] start_timeout_seconds``, warns at once, and the batch fails."""
    from reclock.errors import EngineUnavailable
    from reclock.runtime.planes import LocalDataPlane, StartingSparkDataPlane

    hung = threading.Event()  # the start never returns, like a registration with a silent master
    ran: list[int] = []

    class Counting(LocalDataPlane):
        def run(self, plan, splits):
            ran.append(len(splits))
            return []

    plane = StartingSparkDataPlane(hung.wait, Counting(), timeout_s=0.3, master="spark://silent:7077")
    assert plane.run(None, []) == [] and ran == [0]  # meanwhile, batches run in the driver
    with caplog.at_level("WARNING", logger="reclock.planes"):
        time.sleep(0.6)
    assert any("start_timeout_seconds = 0.3 s" in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(EngineUnavailable, match=r"start_timeout_seconds.*spark://silent:7077"):
        plane.run(None, [])
    with pytest.raises(EngineUnavailable):
        plane.wait()
    hung.set()


def test_the_spark_ui_is_a_documented_setting_off_by_default(tmp_path):
    from reclock.job.config import load_config
    from reclock.job.spark import session_conf

    assert session_conf()["spark.ui.enabled"] == "false"
    assert session_conf(ui=True)["spark.ui.enabled"] == "true"
    assert session_conf({"spark.ui.port": "4050"}, ui=True)["spark.ui.port"] == "4050"
    path = tmp_path / "p.toml"
    path.write_text(
        GENERATOR.format(name="o", lake=tmp_path / "lake", engine="spark", limit=10) + "\n[spark]\nui = true\n"
    )
    config = load_config(path)
    assert config.spark_ui is True and config.to_dict()["spark"]["ui"] is True
    path.write_text(GENERATOR.format(name="o", lake=tmp_path / "lake", engine="spark", limit=10))
    assert "ui" not in load_config(path).to_dict()["spark"]  # older definitions compare equal


def test_stop_of_a_pipeline_that_is_not_running_says_so_and_leaves_no_marker(tmp_path):
    lake = created(tmp_path)
    result = reclock_in_process("--lake", lake, "stop", "orders")
    assert (
        result.returncode == 0
        and result.stdout == "pipeline 'orders' is not running (it is created); nothing to stop\n"
    )
    assert "asked" not in result.stdout + result.stderr
    assert not (tmp_path / "lake" / "orders" / "control" / "stop").exists()


def test_start_of_a_finished_pipeline_says_it_has_finished(tmp_path):
    lake = created(tmp_path)
    first = reclock_in_process("--lake", lake, "start", "orders")
    assert first.returncode == 0 and "batches" in first.stdout and "has finished" not in first.stdout
    again = reclock_in_process("--lake", lake, "start", "orders")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "pipeline 'orders' has finished: its bounded source is in every output; nothing to do\n"


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["status", "orders"], ["batches", "orders"]])
def test_a_lake_that_does_not_exist_is_a_mistake_not_an_empty_lake(tmp_path, command):
    created(tmp_path)
    result = reclock_in_process("--lake", str(tmp_path / "laek"), *command)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr == (
        f"reclock: config error: --lake: there is no lake at {tmp_path / 'laek'}: check --lake and $RECLOCK_LAKE "
        "(reclock create makes a lake)\n"
    )
    (tmp_path / "empty").mkdir()  # an empty lake that exists is just that
    empty = reclock_in_process("--lake", str(tmp_path / "empty"), "status")
    assert (empty.returncode, empty.stdout) == (0, f"no pipelines in {tmp_path / 'empty'}\n")


def test_a_metrics_port_in_use_is_one_line_naming_the_port_and_the_setting(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lake = created(tmp_path)
        definition = tmp_path / "orders.toml"
        definition.write_text(
            definition.read_text().replace("max_batch = 2000", f"max_batch = 2000\nmetrics_port = {port}")
        )
        assert reclock_in_process("create", "--replace", str(definition)).returncode == 0
        result = reclock_in_process("--lake", lake, "start", "orders")
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"pipeline.metrics_port: cannot serve /metrics on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "0 picks a free one" in result.stderr
    status = status_of(lake, "orders")
    assert status["health"] == "failed" and f"127.0.0.1:{port}" in status["last_error"], status


def test_a_name_that_is_refused_says_what_a_name_may_be(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(GENERATOR.format(name="orders-eu", lake=tmp_path / "lake", engine="local", limit=10))
    result = reclock_in_process("create", str(path))
    assert result.returncode == 2
    assert result.stderr == (
        f"reclock: config error: {path}: pipeline.name: 'orders-eu' is not an identifier: use letters, digits and _, "
        "starting with a letter or _, at most 64 characters (such as 'orders_eu')\n"
    )


def test_as_of_at_takes_iso_8601_as_well_as_milliseconds(tmp_path):
    lake = created(tmp_path)
    assert reclock_in_process("--lake", lake, "start", "orders").returncode == 0
    rows = {}
    for at in ("2030-01-01T00:00:00Z", "2030-01-01T01:00:00+01:00", "1893456000000"):
        result = reclock_in_process("--lake", lake, "as-of", "orders", "--at", at, "--json")
        assert result.returncode == 0, result.stderr
        cut = json.loads(result.stdout)
        assert cut["as_of"] == 1_893_456_000_000  # 2030-01-01 00:00 UTC
        rows[at] = cut["pipelines"]["orders"]
    assert len({json.dumps(r, sort_keys=True) for r in rows.values()}) == 1
    assert sum(rows["1893456000000"].values()) == 4000
    bad = reclock_in_process("--lake", lake, "as-of", "orders", "--at", "yesterday")
    assert bad.returncode == 2 and "ISO-8601" in bad.stderr and "'yesterday'" in bad.stderr


FAILING_TRANSFORMS = (
    "".join(f'\n[outputs.{output}]\nsql = "SELECT id / 0 AS broken FROM input"\n' for output in ("persons", "auctions"))
    + '\n[outputs.bids]\nsql = "SELECT auction / 0 AS broken FROM input"\n'
)


class Statuses(io.StringIO):
    """The job's progress stream, reading ``status.json`` as each line is drawn (the job publishes first)."""

    def __init__(self, lake: str) -> None:
        super().__init__()
        self.lake = Lake.at(lake)
        self.seen: list[tuple[str, dict]] = []

    def write(self, text: str) -> int:
        if text.strip():  # the progress line: "orders  <health>  batches ..."
            self.seen.append((text.split()[1], read_status(self.lake, "orders")))
        return super().write(text)


def test_a_transform_that_fails_on_every_row_leaves_the_pipeline_degraded_with_the_error(tmp_path, caplog):
    lake = created(tmp_path, extra=FAILING_TRANSFORMS)
    definition = tmp_path / "orders.toml"
    definition.write_text(definition.read_text().replace("limit = 4000", "rate = 4000"))
    assert reclock_in_process("create", "--replace", str(definition)).returncode == 0
    view = Statuses(lake)
    pipeline = run_until(
        view.lake,
        "orders",
        lambda: len(view.seen) >= 2 and "degraded: every record of batch" in caplog.text,
        "two snapshots of the degraded job",
        progress=view,
    )
    for health, status in view.seen:  # every batch sent all its records to _errors
        assert health == status["health"] == "degraded", (health, status)
        assert status["last_error"].startswith("every record of batch "), status
        assert "Divide by zero" in status["last_error"] and "reclock redrive orders" in status["last_error"]
    assert "degraded: every record of batch" in caplog.text
    # Stopped, it still says why nothing landed; and nothing was lost.
    status = status_of(lake, "orders")
    assert status["health"] == "stopped" and status["last_error"].startswith("every record of batch "), status
    assert status["outputs"]["_errors"][0] > 0
    assert all(rows == 0 for output, (rows, _) in status["outputs"].items() if output != "_errors"), status
    assert not pipeline.finished


def test_a_transform_that_fails_on_some_rows_leaves_the_pipeline_running(tmp_path):
    some = '\n[outputs.bids]\nsql = "SELECT 100 / (auction % 2) AS half FROM input"\n'
    lake = created(tmp_path, limit=4000, extra=some)
    assert reclock_in_process("--lake", lake, "start", "orders").returncode == 0
    status = status_of(lake, "orders")
    assert status["health"] == "stopped" and status["last_error"] is None, status
    assert 0 < status["outputs"]["_errors"][0] < 4000


def test_a_broker_that_cannot_be_reached_is_said_within_seconds_not_after_its_timeout(tmp_path, caplog):
    """Nothing listens on the port: the Kafka probe waits out read_timeout_s to bootstrap, here ten
    times the tests' patience. The job says the source does not answer after SLOW_PROBE_S, in its
    log and in its status: seen while the probe still waits, so not after its timeout."""
    from reclock.job.watch import SLOW_PROBE_S

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    lake = tmp_path / "lake"
    path = tmp_path / "k.toml"
    path.write_text(
        f'[pipeline]\nname = "k"\nlake = "{lake}"\nengine = "local"\n\n'
        f'[source]\nkind = "kafka"\nbootstrap_servers = "127.0.0.1:{port}"\ntopics = ["orders"]\n'
        f"read_timeout_s = {10 * PATIENCE_S:.0f}\n"
    )
    assert reclock_in_process("create", str(path)).returncode == 0
    said: list[dict] = []

    def stalled() -> bool:
        status = read_status(Lake.at(str(lake)), "k") or {}
        if status.get("health") == "stalled":
            said.append(status)
        return bool(said)

    run_until(Lake.at(str(lake)), "k", stalled, "the job to say the broker does not answer")
    waited = re.match(r"the kafka source has not answered for (\d+) s", said[0]["last_error"])
    assert waited and SLOW_PROBE_S <= int(waited[1]) < 10 * PATIENCE_S, said  # the watcher's, not the probe's timeout
    assert "stalled: the kafka source has not answered" in caplog.text

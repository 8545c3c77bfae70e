"""What the terminal says is what happened (issue 24): one line naming the cause and the fix, a
status that says the same, an exit status that tells success from failure.

Every command runs in this process (:func:`tests.cli.reclock_in_process`); none of these tests
starts a JVM: a Spark master that cannot be reached is refused before Spark is started.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.cli import reclock_in_process

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
    began = time.monotonic()
    result = reclock_in_process("--lake", lake, "start", "orders")
    took = time.monotonic() - began
    assert result.returncode == 1, result
    assert took < 20, f"an unreachable master took {took:.0f} s to report"
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

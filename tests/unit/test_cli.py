"""The CLI and pipeline definitions: clear one-line errors, and a job that stops when asked."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from persist.asof import CLOSED_UPPER
from reclock.cli import main
from reclock.config import load_config
from reclock.errors import ConfigError

GOOD = """
[pipeline]
name = "orders"
lake = "lake"
engine = "local"
max_batch = 5000

[source]
kind = "generator"
partitions = 2
limit = 20000
"""


def write(tmp_path, text: str):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        (GOOD.replace('name = "orders"', ""), "pipeline.name", "missing"),
        (GOOD.replace("max_batch = 5000", 'max_batch = "lots"'), "pipeline.max_batch", "expected an integer"),
        (GOOD.replace("max_batch = 5000", "max_batch = 0"), "pipeline.max_batch", ">= 1"),
        (GOOD.replace("max_batch = 5000", "max_bach = 5000"), "pipeline.max_bach", "unknown key"),
        (GOOD.replace('kind = "generator"', 'kind = "ftp"'), "source.kind", "must be one of"),
        (GOOD.replace("partitions = 2", "partitons = 2"), "source.partitons", "unknown option"),
        (GOOD.replace('engine = "local"', 'engine = "flink"'), "pipeline.engine", "must be one of"),
        (GOOD.replace('name = "orders"', 'name = "my orders"'), "pipeline.name", "identifier"),
        (GOOD.replace("[source]", "[sauce]"), "sauce", "unknown key"),
        (GOOD + "\n[pipeline", "syntax", ""),
    ],
)
def test_each_invalid_config_names_its_field(tmp_path, text, field, says):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert error.value.field == field
    assert str(error.value).startswith(f"{path}: {field}: ") and says in str(error.value)


def test_invalid_source_options_are_reported_by_the_cli_in_one_line(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("partitions = 2", "partitions = 0"))
    assert main(["create", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "source.partitions" in err[0] and "Traceback" not in err[0]


def test_missing_config_file_is_a_clean_error(tmp_path, capsys):
    assert main(["create", str(tmp_path / "nope.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_recreating_with_a_different_definition_needs_replace(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert main(["create", str(path)]) == 0
    assert main(["create", str(path)]) == 0  # identical: nothing to do
    write(tmp_path, GOOD.replace("max_batch = 5000", "max_batch = 6000"))
    assert main(["create", str(path)]) == 2
    assert "--replace" in capsys.readouterr().err
    assert main(["create", "--replace", str(path)]) == 0


def test_start_runs_a_bounded_pipeline_to_the_end_and_status_shows_it(tmp_path, capsys):
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    lake = str(tmp_path / "lake")
    assert main(["--lake", lake, "start", "orders"]) == 0
    capsys.readouterr()
    assert main(["--lake", lake, "status", "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)
    assert status["finished"] and status["health"] == "stopped"
    assert sum(rows for name, (rows, _) in status["outputs"].items()) == 20_000
    assert len({upper for _, upper in status["outputs"].values()}) == 1  # every output holds the closing binding
    assert status["readable_upper"] == CLOSED_UPPER  # a finished pipeline holds no reader back


def start_running_job(tmp_path) -> tuple[subprocess.Popen, object]:
    """A real ``reclock start`` of a slow, long generator pipeline, once its first batch landed."""
    path = write(tmp_path, GOOD.replace("limit = 20000", "limit = 200000\nrate = 20000"))
    lake = tmp_path / "lake"
    assert main(["create", str(path)]) == 0
    job = subprocess.Popen(
        [sys.executable, "-m", "reclock.cli", "--lake", str(lake), "start", "orders"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    status_path = lake / "orders" / "status.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (status_path.exists() and json.loads(status_path.read_text())["batches"]):
        time.sleep(0.05)
    return job, status_path


def test_stop_lets_the_in_flight_batch_finish_and_start_continues(tmp_path):
    job, status_path = start_running_job(tmp_path)
    assert main(["--lake", str(tmp_path / "lake"), "stop", "orders"]) == 0
    assert job.wait(timeout=60) == 0, job.stderr.read()
    stopped = json.loads(status_path.read_text())
    assert stopped["health"] == "stopped" and not stopped["finished"]
    assert stopped["resume_upper"] > 0  # the batch in flight when asked completed and committed


def test_sigterm_stops_a_job_cleanly(tmp_path):
    job, status_path = start_running_job(tmp_path)
    job.terminate()
    assert job.wait(timeout=60) == 0, job.stderr.read()
    assert json.loads(status_path.read_text())["health"] == "stopped"


def test_a_stored_definition_parses_back_to_the_same_config(tmp_path):
    config = load_config(
        write(
            tmp_path,
            GOOD.replace(
                "max_batch = 5000",
                "max_batch = 5000\nmetrics_port = 9464\nstop_on_error = false\nstatus_retention_days = 2.5",
            ),
        )
    )
    from reclock.config import parse_config

    assert parse_config(config.to_dict()) == config
    assert config.metrics_port == 9464 and not config.settings.stop_on_error


def test_create_honours_an_explicit_lake(tmp_path):
    other = tmp_path / "elsewhere"
    assert main(["--lake", str(other), "create", str(write(tmp_path, GOOD))]) == 0
    assert (other / "orders" / "definition.json").exists() and not (tmp_path / "lake").exists()


def test_an_unset_environment_variable_is_a_config_error_naming_the_field(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RECLOCK_TEST_SEED", raising=False)
    path = write(tmp_path, GOOD.replace("limit = 20000", 'limit = 20000\nseed = "${RECLOCK_TEST_SEED}"'))
    assert main(["create", str(path)]) == 2
    assert "source.seed: environment variable RECLOCK_TEST_SEED is not set" in capsys.readouterr().err


def test_drop_file_refuses_a_pipeline_that_reads_no_files(tmp_path, capsys):
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    assert main(["--lake", str(tmp_path / "lake"), "drop-file", "orders", "a.csv"]) == 2
    assert "drop-file applies to files pipelines" in capsys.readouterr().err


def test_small_batches_run_in_the_driver_and_large_ones_on_the_other_plane(tmp_path):
    from reclock.dataplane import AutoDataPlane, BatchPlan
    from sources.base import Split

    class Recording:
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def run(self, plan: BatchPlan, splits):
            self.sizes.append(sum(s.end - s.start for s in splits))
            return []

    spark, local = Recording(), Recording()
    plane = AutoDataPlane(spark, local, small_batch_offsets=1_000)
    plane.run(None, [Split("p", 0, 400), Split("q", 0, 599)])
    plane.run(None, [Split("p", 400, 1_400)])
    assert local.sizes == [999] and spark.sizes == [1_000]
    config = load_config(write(tmp_path, GOOD + "\n[spark]\nsmall_batch_offsets = 0\n"))
    assert config.small_batch_offsets == 0

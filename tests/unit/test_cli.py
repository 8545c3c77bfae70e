"""The CLI and pipeline definitions: clear one-line errors, and a job that stops when asked."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from reclock.cli.main import main
from reclock.errors import ConfigError
from reclock.job.config import load_config
from reclock.persist.asof import CLOSED_UPPER, read_as_of, readable_upper
from tests import zygote
from tests.waiting import PATIENCE_S, wait_until

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


def test_as_of_reads_of_a_pipeline_the_lake_lacks_name_it_instead_of_returning_nothing(tmp_path):
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    lake = tmp_path / "lake"
    assert readable_upper(lake, "orders") == 0  # created, never started: no cut yet, and no error
    for read in (lambda: readable_upper(lake, "ordres"), lambda: read_as_of(lake, "ordres", -1)):
        with pytest.raises(ConfigError, match=r"no pipeline 'ordres' in lake .* \(known: orders\)"):
            read()


def start_running_job(tmp_path) -> tuple[subprocess.Popen, object]:
    """A real ``reclock start`` of a slow, endless generator pipeline, once its first batch landed.

    At 20,000 records a second its limit takes ten times the tests' patience: only a stop ends it."""
    limit = int(20_000 * 10 * PATIENCE_S)
    path = write(tmp_path, GOOD.replace("limit = 20000", f"limit = {limit}\nrate = 20000"))
    lake = tmp_path / "lake"
    assert main(["create", str(path)]) == 0
    job = zygote.popen(
        ["--lake", str(lake), "start", "orders"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    status_path = lake / "orders" / "status.json"
    wait_until(lambda: status_path.exists() and json.loads(status_path.read_text())["batches"], "the first batch")
    return job, status_path


@pytest.mark.usefixtures("reclock_processes")
def test_stop_lets_the_in_flight_batch_finish_and_start_continues(tmp_path):
    job, status_path = start_running_job(tmp_path)
    assert main(["--lake", str(tmp_path / "lake"), "stop", "orders"]) == 0
    assert job.wait(timeout=PATIENCE_S) == 0, job.stderr.read()
    stopped = json.loads(status_path.read_text())
    assert stopped["health"] == "stopped" and not stopped["finished"]
    assert stopped["resume_upper"] > 0  # the batch in flight when asked completed and committed


@pytest.mark.usefixtures("reclock_processes")
def test_stop_wait_that_runs_out_says_the_job_still_runs_and_exits_1(tmp_path, capsys):
    job, status_path = start_running_job(tmp_path)
    job.send_signal(signal.SIGSTOP)  # paused: it holds its lease, and cannot read the stop in time
    try:
        assert main(["--lake", str(tmp_path / "lake"), "stop", "orders", "--wait", "1"]) == 1  # load-safe: paused
    finally:
        job.send_signal(signal.SIGCONT)
    err = capsys.readouterr().err
    assert "pipeline 'orders' is still running after 1 s; the stop stays asked" in err, err
    assert job.wait(timeout=PATIENCE_S) == 0, job.stderr.read()  # the stop stayed asked: it stops once resumed
    assert json.loads(status_path.read_text())["health"] == "stopped"


@pytest.mark.usefixtures("reclock_processes")
def test_sigterm_stops_a_job_cleanly(tmp_path):
    job, status_path = start_running_job(tmp_path)
    job.terminate()
    assert job.wait(timeout=PATIENCE_S) == 0, job.stderr.read()
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
    from reclock.job.config import parse_config

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
    from reclock.runtime.planes import AutoDataPlane
    from reclock.runtime.task import BatchPlan
    from reclock.sources.base import Split

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


def test_a_snapshot_chunk_weighs_its_rows_not_its_one_offset():
    """A snapshot batch is a few offsets (one a chunk) of many rows: by offsets it would always
    land in the driver, a table of any size; by rows a large one goes to Spark, a small one stays,
    and tasks are balanced by rows (the last chunk of a table is the short one)."""
    from reclock.runtime.planes import AutoDataPlane, _pack
    from reclock.sources.postgres.snapshot import Chunk
    from reclock.sources.postgres.source import WAL, ChunkSplit

    class Recording:
        def __init__(self) -> None:
            self.batches: list[int] = []

        def run(self, plan, splits):
            self.batches.append(len(splits))
            return []

    def chunks(*rows: int) -> list[ChunkSplit]:
        return [ChunkSplit(WAL, i, i + 1, Chunk("public_t", f"c{i}", n), 99) for i, n in enumerate(rows)]

    spark, local = Recording(), Recording()
    plane = AutoDataPlane(spark, local, small_batch_offsets=20_000)
    plane.run(None, chunks(100_000, 100_000, 100_000, 100_000, 30_000))
    plane.run(None, chunks(15_000, 4_000))
    assert spark.batches == [5] and local.batches == [2]
    groups = _pack(chunks(100_000, 50_000, 50_000), 2)
    assert sorted(sum(s.weight for s in group) for group in groups) == [100_000, 100_000]


# -- mistakes end in one line naming the field, never a traceback ---------------------------------


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI in process (an uncaught exception fails the test) and return its one stderr line."""
    with pytest.raises(SystemExit) as exited:
        sys.exit(main(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_config_file_that_is_not_utf8_or_not_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes(GOOD.replace('"orders"', '"caf\xe9"').encode("latin-1"))
    assert "latin1.toml: file: is not UTF-8 text" in one_line_error(capsys, ["create", str(path)])
    assert f"{tmp_path}: file: is a directory" in one_line_error(capsys, ["create", str(tmp_path)])


def test_a_source_without_a_required_option_names_it(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace('kind = "generator"\npartitions = 2\nlimit = 20000', 'kind = "files"'))
    assert "source.path: missing" in one_line_error(capsys, ["create", str(path)])
    kafka = write(tmp_path, GOOD.replace('kind = "generator"\npartitions = 2\nlimit = 20000', 'kind = "kafka"'))
    assert "source.bootstrap_servers: missing" in one_line_error(capsys, ["create", str(kafka)])


def test_a_lake_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "lake").write_text("not a folder")
    line = one_line_error(capsys, ["create", str(write(tmp_path, GOOD))])
    assert "lake: " in line and "is a file" in line
    for command in (["status"], ["start", "orders"], ["errors", "orders"]):
        assert "is a file" in one_line_error(capsys, ["--lake", str(tmp_path / "lake" / "sub"), *command])


@pytest.mark.parametrize("key", ["batch_interval", "idle_interval", "retry_backoff", "max_backoff"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_intervals_are_refused(tmp_path, capsys, key, value):
    path = write(tmp_path, GOOD.replace("max_batch = 5000", f"{key} = {value}"))
    line = one_line_error(capsys, ["create", str(path)])
    assert f"pipeline.{key}: must be a finite number >= 0" in line


def test_non_finite_retention_is_refused(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("max_batch = 5000", "status_retention_days = nan"))
    line = one_line_error(capsys, ["create", str(path)])
    assert "pipeline.status_retention_days: must be a finite number > 0" in line


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["start", "orders", "--max-seconds", "nan"], "--max-seconds"),
        (["start", "orders", "--max-seconds", "inf"], "--max-seconds"),
        (["start", "orders", "--max-seconds", "-1"], "--max-seconds"),
        (["stop", "orders", "--wait", "nan"], "--wait"),
        (["batches", "orders", "--limit", "-5"], "--limit"),
        (["files", "orders", "--limit", "-5"], "--limit"),
        (["errors", "orders", "--limit", "-5"], "--limit"),
        (["demo", "--rate", "inf"], "--rate"),
        (["demo", "--events", "-1"], "--events"),
    ],
)
def test_command_line_numbers_out_of_range_are_one_line_naming_the_argument(tmp_path, capsys, argv, argument):
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["--lake", str(tmp_path / "lake"), *argv])
    assert f"argument {argument}: must be" in line


@pytest.mark.usefixtures("reclock_processes")
def test_status_piped_into_a_reader_that_goes_away_ends_quietly(tmp_path):
    """``reclock status | head -1``: the reader closes the pipe; no BrokenPipeError on stderr."""
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    status = subprocess.Popen(  # a real interpreter: its own exit's flush of a closed pipe is pinned
        [sys.executable, "-m", "reclock.cli", "--lake", str(tmp_path / "lake"), "status"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    status.stdout.close()  # before it writes: every write now fails with EPIPE
    err = status.stderr.read().decode()
    assert status.wait(timeout=60) in (0, 141), err
    assert err == ""


# -- status over a lake with a broken table -----------------------------------------------------


def test_status_shows_an_unreadable_output_in_its_row_and_still_lists_the_others(tmp_path, capsys):
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    assert main(["create", str(write(tmp_path, GOOD.replace('"orders"', '"clicks"')))]) == 0
    lake = tmp_path / "lake"
    assert main(["--lake", str(lake), "start", "orders"]) == 0
    assert main(["--lake", str(lake), "start", "clicks"]) == 0
    log = lake / "orders" / "outputs" / "bids" / "_delta_log"
    for entry in log.glob("*.json"):
        entry.write_text("this is not a Delta log entry\n")
    capsys.readouterr()
    assert main(["--lake", str(lake), "status", "--json"]) == 0
    rows = {r["pipeline"]: r for r in json.loads(capsys.readouterr().out)}
    assert "cannot read output 'bids'" in rows["orders"]["unreadable"]
    assert rows["orders"]["outputs"]["bids"] == [None, None] and rows["orders"]["outputs"]["persons"][0] > 0
    assert rows["clicks"]["unreadable"] is None and rows["clicks"]["readable_upper"] == CLOSED_UPPER
    assert sum(n for n, _ in rows["clicks"]["outputs"].values()) == 20_000
    assert main(["--lake", str(lake), "status"]) == 0
    table = capsys.readouterr().out
    assert "cannot read output 'bids'" in table and "clicks outputs:" in table
    assert len(table.split("\n\n")[0].splitlines()) == 4  # header, rule, one line per pipeline


def test_status_counts_rows_of_files_committed_without_statistics(tmp_path, capsys):
    """Delta add actions may carry no ``numRecords`` (another writer); the footer has the count."""
    assert main(["create", str(write(tmp_path, GOOD))]) == 0
    lake = tmp_path / "lake"
    assert main(["--lake", str(lake), "start", "orders"]) == 0
    bids = lake / "orders" / "outputs" / "bids"
    entries = sorted((bids / "_delta_log").glob("*.json"))
    for entry in entries:
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        for action in actions:
            action.get("add", {}).pop("stats", None)
        entry.write_text("".join(json.dumps(a) + "\n" for a in actions))
    truth = sum(pq.ParquetFile(p).metadata.num_rows for p in bids.glob("*.parquet"))
    capsys.readouterr()
    assert main(["--lake", str(lake), "status", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["outputs"]["bids"][0] == truth > 0 and row["unreadable"] is None


@pytest.mark.usefixtures("reclock_processes")
def test_a_second_start_of_a_running_pipeline_is_refused(tmp_path, capsys):
    job, _ = start_running_job(tmp_path)
    try:
        capsys.readouterr()
        assert main(["--lake", str(tmp_path / "lake"), "start", "orders"]) == 1
        err = capsys.readouterr().err
        assert f"pipeline 'orders' is already running (pid {job.pid})" in err
    finally:
        job.terminate()
        assert job.wait(timeout=PATIENCE_S) == 0


# -- a Kafka pipeline whose broker is down (nothing listens on its port: no broker needed) ------

KAFKA = """
[pipeline]
name = "events"
lake = "lake"
engine = "local"
retry_backoff = 0.2

[source]
kind = "kafka"
bootstrap_servers = "127.0.0.1:{port}"
topics = ["events"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(lake, name: str, max_seconds: float) -> subprocess.CompletedProcess:
    """``reclock start`` in a subprocess, given the tests' patience to end (it raises past it)."""
    return zygote.run(
        ["--lake", str(lake), "start", name, "--max-seconds", str(max_seconds)],
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )


@pytest.mark.usefixtures("reclock_processes")
def test_max_seconds_holds_while_the_kafka_broker_is_down(tmp_path):
    """A probe waits up to read_timeout_s for a broker; a stop must not.

    The probe's wait is made ten times the tests' patience, so a job that waited for it is not
    told from one that stopped on time by seconds: it does not end before the patience runs out.
    """
    text = KAFKA.format(port=free_port()) + f"read_timeout_s = {10 * PATIENCE_S:.0f}\n"
    assert main(["create", str(write(tmp_path, text))]) == 0
    done = start_job(tmp_path / "lake", "events", 3)  # raises TimeoutExpired if the stop waited for the probe
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "lake" / "events" / "status.json").read_text())["health"] == "stopped"


def run_until_said(lake, name: str, log, said: str) -> subprocess.CompletedProcess:
    """``reclock start`` in a subprocess until its log says ``said``, then stopped: what the job
    says is waited for, however long a loaded machine takes to start it and time its probe out."""
    with open(log, "w") as err:
        job = zygote.popen(["--lake", str(lake), "start", name], stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            wait_until(lambda: said in log.read_text(), f"the job to say {said!r}")
            assert main(["--lake", str(lake), "stop", name]) == 0
            code = job.wait(timeout=PATIENCE_S)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(timeout=PATIENCE_S)
    return subprocess.CompletedProcess(job.args, code, "", log.read_text())


@pytest.mark.usefixtures("reclock_processes")
def test_a_number_valued_secret_is_masked_in_the_status_table_and_status(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RECLOCK_TEST_SSL_PASSWORD", "hunter2-from-env")  # the job subprocess inherits it
    text = KAFKA.format(port=free_port()) + (
        "read_timeout_s = 1\n"
        "[source.client_settings]\n"
        "sasl_plain_password = 99887766\n"  # a number in TOML: masked by its key, not by its type
        'ssl_password = "${RECLOCK_TEST_SSL_PASSWORD}"\n'
    )
    assert main(["create", str(write(tmp_path, text))]) == 0
    lake = tmp_path / "lake"
    done = run_until_said(lake, "events", tmp_path / "job.log", "KafkaTimeoutError: Unable to bootstrap")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stalled" in done.stderr and "KafkaTimeoutError: Unable to bootstrap" in done.stderr
    assert "KafkaTimeoutError: KafkaTimeoutError" not in done.stderr  # the type is said once
    # The pipelines status table, read from its parquet files (every one of them, even removed ones).
    files = list((lake / "_status" / "pipelines").glob("*.parquet"))
    configs = [c for f in files for c in pq.read_table(f, columns=["config"]).column("config").to_pylist()]
    assert configs and all('"sasl_plain_password": "***"' in c and '"ssl_password": "***"' in c for c in configs)
    capsys.readouterr()
    assert main(["--lake", str(lake), "status", "--json"]) == 0
    shown = capsys.readouterr().out + done.stdout + done.stderr + (lake / "events" / "status.json").read_text()
    for secret in ("99887766", "hunter2-from-env"):
        assert secret not in shown and not any(secret in c for c in configs)
    definition = (lake / "events" / "definition.json").read_text()
    assert "${RECLOCK_TEST_SSL_PASSWORD}" in definition and "hunter2-from-env" not in definition


@pytest.mark.parametrize("value", ["hunter2-from-env", "-3"])
def test_an_invalid_value_from_the_environment_is_named_but_never_shown(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("RECLOCK_TEST_KPASS", value)
    text = KAFKA.format(port=free_port()) + 'read_timeout_s = "${RECLOCK_TEST_KPASS}"\n'
    path = write(tmp_path, text)
    line = one_line_error(capsys, ["create", str(path)])
    assert "source.read_timeout_s: " in line and "${RECLOCK_TEST_KPASS}" in line
    assert value not in line.replace(str(path), "")  # the file's name may hold "-3" (pytest-322/...)

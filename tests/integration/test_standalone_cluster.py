"""A real Spark standalone cluster: executors that can import only what the driver shipped.

The cluster (``spark_cluster``) is a master and two workers from the pyspark wheel, separate
processes on 127.0.0.1. Executors run a node's Python (``executor_python``): reclock's
dependencies, but neither reclock nor the plugin, which the first test proves by running a plain
task there. The driver is a user's environment with the ``sensorlog`` plugin installed by pip
(``plugin_python``), started through the ``reclock`` CLI as a user would; it ships both packages
to the executors when its session starts (``reclock/job/spark.py``). What landed is read from outside
(``tests.faults.reader``), and the workers' own executor logs show that tasks ran on both.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.integration.cluster import (
    EXECUTORS,
    SPARK_HOME,
    applications,
    cluster_env,
    finish,
    start_on_cluster,
    tasks_per_worker,
)
from tests.integration.envs import ROOT, clean_env
from tests.integration.helpers import (
    assert_rows_exactly_once,
    expected_generator_offsets,
    sensorlog_rows,
)

DEPLOY = ROOT / "docs" / "deploy.md"
MARKER = re.compile(r"^<!-- deploy: (\S+) -->\s*$")

PROBE = """
import importlib.util, json, sys
from pyspark import SparkConf, SparkContext

conf = SparkConf().setMaster(sys.argv[1]).setAppName("probe").setAll(json.loads(sys.argv[2]).items())
sc = SparkContext(conf=conf)
sc.setLogLevel("ERROR")
names = json.loads(sys.argv[3])
where = lambda _: {name: importlib.util.find_spec(name) is not None for name in names}
print(json.dumps(sc.parallelize(range(4), 4).map(where).collect()))
sc.stop()
"""


def test_a_plain_executor_task_cannot_import_reclock_or_the_plugin(spark_cluster, executor_python, plugin_python):
    names = ["reclock", "sensorlog", "pyarrow", "deltalake", "numpy"]
    done = subprocess.run(
        [str(plugin_python), "-c", PROBE, spark_cluster.master_url, json.dumps(EXECUTORS), json.dumps(names)],
        capture_output=True,
        text=True,
        timeout=300,
        env=cluster_env(executor_python, plugin_python),
    )
    assert done.returncode == 0, done.stderr[:3000]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == [{"reclock": False, "sensorlog": False, "pyarrow": True, "deltalake": True, "numpy": True}] * 4
    # ...while the driver imports both, which is what it ships
    driver = subprocess.run(
        [str(plugin_python), "-c", "import reclock, sensorlog"], env=clean_env(), capture_output=True, text=True
    )
    assert driver.returncode == 0, driver.stderr


def deploy_blocks() -> dict[str, str]:
    """The fenced block after each ``<!-- deploy: NAME -->`` marker of ``docs/deploy.md``, by NAME."""
    lines = DEPLOY.read_text().splitlines(keepends=True)
    blocks = {}
    for i, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker:
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            blocks[marker.group(1)] = "".join(lines[i + 2 : end])
    return blocks


def write_sensor_logs(logs: Path) -> dict[str, dict[tuple[str, int], dict]]:
    """Three sites' lines, some broken, some alerts, and END; the rows they must give."""
    logs.mkdir()
    for site, count in (("north", 900), ("south", 700), ("east", 400)):
        lines = [json.dumps({"sensor": f"{site[0]}{i % 3}", "c": i / 4}) for i in range(count)]
        lines[::97] = ["{oops"] * len(lines[::97])
        lines[5::89] = [json.dumps({"sensor": "x", "alert": f"hot {i}"}) for i in range(len(lines[5::89]))]
        (logs / f"{site}.jsonl").write_text("\n".join(lines) + "\n")
    (logs / "END").touch()
    expected = sensorlog_rows(logs)
    assert all(len(rows) > 10 for rows in expected.values())
    return expected


def test_the_deploy_guides_commands_run_the_plugin_on_the_cluster_exactly_once(
    spark_cluster, executor_python, plugin_python, tmp_path
):
    """``docs/deploy.md``: the CLI, then spark-submit, each into a lake of its own."""
    earlier = applications(spark_cluster)
    blocks = deploy_blocks()
    env = cluster_env(executor_python, plugin_python)
    env["PATH"] = f"{SPARK_HOME / 'bin'}:{env['PATH']}"  # spark-submit, as in a venv that has pyspark

    def as_here(text: str) -> str:
        return text.replace("spark://127.0.0.1:7077", spark_cluster.master_url).replace(
            "/opt/node-python/bin/python", str(executor_python)
        )

    for folder, script in (
        ("cli", blocks["reclock"]),
        ("submit", "reclock create cluster.toml\n" + blocks["spark-submit"]),
    ):
        here = tmp_path / folder
        here.mkdir()
        expected = write_sensor_logs(here / "logs")
        (here / "cluster.toml").write_text(as_here(blocks["cluster.toml"]))
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", as_here(script)],
            cwd=here,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert_rows_exactly_once(here / "lake", "sensors", expected)
        if folder == "cli":
            assert re.search(r"^sensors +stopped +yes ", done.stdout, re.MULTILINE), done.stdout
    assert len(applications(spark_cluster) - earlier) == 2 * len(spark_cluster.worker_dirs())
    # Each run's batch of three sites, packed by weight into a task per core of the cluster when
    # they balance (north 900 lines against south and east's 1,100): the work is on both workers.
    ran = tasks_per_worker(spark_cluster, skip=earlier)
    assert all(n >= 2 for n in ran), f"tasks per worker's executors over the two runs: {ran}"


def test_the_generator_runs_on_the_cluster_exactly_once(spark_cluster, executor_python, plugin_python, tmp_path):
    earlier = applications(spark_cluster)
    generator = {"kind": "generator", "partitions": 4, "limit": 12_000, "max_split_offsets": 1_000}
    job = start_on_cluster(tmp_path, "generated", generator, spark_cluster, executor_python, plugin_python)
    finish(job, tmp_path, "generated")
    keys = expected_generator_offsets(4, 12_000)
    assert_rows_exactly_once(
        tmp_path / "lake",
        "generated",
        {"_errors": {}, **{output: {key: {} for key in offsets} for output, offsets in keys.items()}},
    )
    ran = tasks_per_worker(spark_cluster, skip=earlier)
    assert all(n > 0 for n in ran), f"tasks per worker's executors: {ran}"

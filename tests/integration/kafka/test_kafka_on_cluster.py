"""Kafka into a local lake on the Spark standalone cluster, by executors that import only what
the driver shipped (see ``tests/integration/test_standalone_cluster.py`` for the cluster).

The broker is the session's Tansu; the ground truth is the producer's delivery coordinates. The
job is unbounded: it is stopped with ``reclock stop`` once its status says every record is in, and
the tables are then read from outside (``tests.faults.reader``).
"""

from __future__ import annotations

import json
import subprocess
import time

from reclock.sources.kafka import output_name_for
from reclock.timeline.frontier import encode_partition
from tests.integration.cluster import applications, cluster_env, finish, start_on_cluster, tasks_per_worker
from tests.integration.helpers import assert_rows_exactly_once


def test_kafka_runs_on_the_cluster_exactly_once(
    broker, topic, produce, spark_cluster, executor_python, plugin_python, tmp_path
):
    earlier = applications(spark_cluster)
    t = topic(partitions=3)
    values = [json.dumps({"id": i, "topic": t}).encode() for i in range(6_000)]
    delivered = produce.send(t, values, partition=lambda i: i % 3)
    source = {
        "kind": "kafka",
        "bootstrap_servers": broker.bootstrap,
        "topics": [t],
        "format": "json",
        "schema": {"id": "int64", "topic": "string"},
        "read_timeout_s": 30.0,
        "max_split_offsets": 1_000,
    }
    job = start_on_cluster(tmp_path, "orders", source, spark_cluster, executor_python, plugin_python)
    status_path = tmp_path / "lake" / "orders" / "status.json"
    deadline = time.monotonic() + 600
    rows = 0
    while rows < len(values) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        status = json.loads(status_path.read_text()) if status_path.exists() else {}
        rows = status.get("rows", {}).get(output_name_for(t), 0)
    stop = subprocess.run(
        ["reclock", "stop", "orders", "--wait", "120"],
        cwd=tmp_path,
        env=cluster_env(executor_python, plugin_python),
        capture_output=True,
        text=True,
    )
    assert stop.returncode == 0, stop.stderr
    finish(job, tmp_path, "orders")
    assert rows == len(values)

    want = {(encode_partition((topic_, p)), o): {"id": i} for i, (topic_, p, o) in enumerate(delivered)}
    assert_rows_exactly_once(tmp_path / "lake", "orders", {output_name_for(t): want, "_errors": {}})
    ran = tasks_per_worker(spark_cluster, skip=earlier)
    assert all(n > 0 for n in ran), f"tasks per worker's executors: {ran}"

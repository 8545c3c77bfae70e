"""A Kafka pipeline into a lake on a real S3-compatible server, SIGKILLed mid-run and restarted.

Ground truth is what the broker acknowledged to the test's producer; what landed is read from the
server through a boto3 mirror and the independent Delta log reader of ``tests.faults.reader``.
The stop at the end goes through the stop request the CLI drops into the store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from reclock.sources.base import ERRORS
from reclock.sources.kafka import output_name_for
from reclock.timeline.frontier import Frontier, encode_partition
from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import write_config
from tests.integration.kafka.test_kafka_pipeline import SCHEMA, _ends, _Feeder
from tests.integration.s3 import S3Server, mirror
from tests.waiting import PATIENCE_S

pytestmark = [pytest.mark.usefixtures("reclock_processes")]


def _status(server: S3Server, bucket: str, key: str) -> dict:
    client = server.client()
    try:
        return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except client.exceptions.NoSuchKey:
        return {}


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_kafka_pipeline_into_an_s3_lake_sigkilled_and_restarted_lands_every_record_once(
    broker, topic, s3_server, tmp_path
):
    name, bucket = "streams", s3_server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    status_key = f"lake/{name}/status.json"
    env = {**os.environ, **s3_server.environ, "PYSPARK_PYTHON": sys.executable}
    t = topic(partitions=3)
    output = output_name_for(t)
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": name, "lake": lake_uri, "engine": "local", "max_batch": 600, "batch_interval": 0.1},
        source={
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap,
            "topics": [t],
            "format": "json",
            "schema": SCHEMA,
            "read_timeout_s": 5.0,
        },
    )
    created = reclock_in_process("create", str(config), env=env)
    assert created.returncode == 0, created.stderr
    feeder = _Feeder(broker.bootstrap, t, partitions=3)
    feeder.start()
    stderr = open(tmp_path / "job.stderr", "ab")  # noqa: SIM115 - closed below
    jobs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        job = zygote.popen(
            ["--lake", lake_uri, "start", name],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        jobs.append(job)
        return job

    try:
        first = start()
        _wait_for(lambda: _status(s3_server, bucket, status_key).get("batches", 0) >= 4, PATIENCE_S, "four batches")
        os.killpg(first.pid, signal.SIGKILL)  # mid-run: the producer keeps going
        assert first.wait(timeout=PATIENCE_S) == -signal.SIGKILL
        killed_at = len(feeder.produced)
        second = start()
        _wait_for(lambda: len(feeder.produced) > killed_at + 600, PATIENCE_S, "records produced after the kill")
        feeder.stop.set()
        feeder.join(timeout=PATIENCE_S)
        assert feeder.failure is None
        ends = _ends(feeder.produced)

        def all_in() -> bool:
            resume = Frontier.from_json(_status(s3_server, bucket, status_key).get("resume_frontier", "{}"))
            return all(resume.covers(p, end - 1) for p, end in ends.items())

        _wait_for(all_in, PATIENCE_S, "the restarted job to catch up")
        stopped = reclock_in_process("--lake", lake_uri, "stop", name, "--wait", f"{PATIENCE_S:.0f}", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert second.wait(timeout=60) == 0, (tmp_path / "job.stderr").read_text()[-3000:]
    finally:
        feeder.stop.set()
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        stderr.close()

    copy = mirror(s3_server, bucket, f"lake/{name}", tmp_path / "mirror")
    remap = Remap.read(copy / "remap")
    rows = read_rows(DeltaLog(copy / "outputs" / output).refresh()).to_pylist()
    lineage = Counter((r["_partition"], r["_offset"]) for r in rows)
    assert not [k for k, n in lineage.items() if n > 1], "duplicated rows"
    want = {(encode_partition((tp, p)), o): i for (tp, p, o), i in feeder.produced.items()}
    assert set(lineage) == set(want), (
        f"missing {len(set(want) - set(lineage))}, unexpected {len(set(lineage) - set(want))}"
    )
    assert all(r["id"] == want[(r["_partition"], r["_offset"])] for r in rows), "payload mismatch"
    assert all(remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"]) for r in rows)
    assert read_rows(DeltaLog(copy / "outputs" / ERRORS).refresh()).num_rows == 0

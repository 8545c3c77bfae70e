"""Broker faults beyond a pause: the broker replaced by an empty one, under a running job.

A broker that stops answering and comes back (SIGSTOP/SIGCONT) is covered by
``test_paused_broker_stalls_the_pipeline_then_it_recovers_and_loses_and_duplicates_nothing`` in
test_kafka_pipeline.py. Here the broker is killed and an *empty* one takes its place: the topics the
pipeline has bound are gone. Waiting for them would hang forever and re-reading a re-created
topic from offset 0 would duplicate or mislabel rows, so the only right answer is a definite
error naming the topic, with the outputs exactly as they were.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from reclock.demo.broker import BrokerError, EmbeddedBroker
from tests.cli import reclock_in_process
from tests.faults.crash import partition_id
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import write_config
from tests.integration.kafka.conftest import Producer
from tests.integration.kafka.test_kafka_pipeline import SCHEMA, _ends, _produce, _start_job, _status, _wait_for
from tests.waiting import PATIENCE_S

# Brokers of its own, stopped and replaced under a `reclock start` subprocess.
pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("reclock_processes")]

TOPIC = "orders"


def _empty_broker_on(port: int) -> EmbeddedBroker:
    """A fresh broker on ``port`` as soon as the old one's socket is released."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            return EmbeddedBroker(port=port).start()
        except BrokerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _config(tmp_path: Path, name: str, bootstrap: str) -> Path:
    return write_config(
        tmp_path / "p.toml",
        pipeline={"name": name, "lake": "lake", "engine": "local", "batch_interval": 0.1, "retry_backoff": 0.2},
        source={
            "kind": "kafka",
            "bootstrap_servers": bootstrap,
            "topics": [TOPIC],
            "format": "json",
            "schema": SCHEMA,
            "read_timeout_s": 2.0,
        },
    )


def _landed(lake: Path, name: str) -> Counter:
    """``(partition, offset) -> rows`` over the output and ``_errors``, read independently, each
    row checked against the durable bindings' stamp."""
    remap = Remap.read(lake / name / "remap")
    landed: Counter = Counter()
    for output in (TOPIC, "_errors"):
        table = read_rows(DeltaLog(lake / name / "outputs" / output).refresh())
        for row in table.to_pylist() if table is not None else []:
            landed[(row["_partition"], row["_offset"])] += 1
            assert row["_into_ts"] == remap.stamp(row["_partition"], row["_offset"]), row
    return landed


def _in(lake: Path, name: str, ends: dict) -> bool:
    return set(_landed(lake, name)) >= {(partition_id(t, p), o) for (t, p), end in ends.items() for o in range(end)}


@pytest.mark.parametrize("how", ["while-running", "same-port-at-restart", "new-port-at-restart"])
def test_broker_replaced_by_an_empty_one_fails_the_pipeline_naming_the_topic_and_duplicates_nothing(tmp_path, how):
    name, lake = "replaced", tmp_path / "lake"
    first = EmbeddedBroker().start()
    second: EmbeddedBroker | None = None
    job = None
    try:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=first.bootstrap)
        admin.create_topics([NewTopic(TOPIC, 2, 1)])
        admin.close()
        producer = Producer(first.bootstrap)
        produced = _produce(producer, TOPIC, range(300), partitions=2)
        producer.close()
        assert reclock_in_process("create", str(_config(tmp_path, name, first.bootstrap))).returncode == 0
        stderr = tmp_path / "job.stderr"
        job = _start_job(lake, name, stderr)
        _wait_for(lambda: _in(lake, name, _ends(produced)), 60, "the records on the first broker")
        port = first.port
        if how == "while-running":
            first.stop()
            second = _empty_broker_on(port)
        else:  # the job is down while the broker is replaced, and starts against the empty one
            assert reclock_in_process("--lake", str(lake), "stop", name, "--wait", f"{PATIENCE_S:.0f}").returncode == 0
            assert job.wait(timeout=PATIENCE_S) == 0
            first.stop()
            if how == "same-port-at-restart":
                second = _empty_broker_on(port)
            else:  # the operator points the pipeline at the new broker
                second = EmbeddedBroker().start()
                config = _config(tmp_path, name, second.bootstrap)
                assert reclock_in_process("create", str(config), "--replace").returncode == 0
            job = _start_job(lake, name, stderr)
        code = job.wait(timeout=90)
        assert code == 1, f"exit {code}: {stderr.read_text()[-2000:]}"
        last = stderr.read_text().strip().splitlines()[-1]
        assert TOPIC in last and "Traceback" not in stderr.read_text(), last  # one line naming the topic
        status = _status(lake, name)
        assert status["health"] == "failed" and TOPIC in status["last_error"], status
        shown = reclock_in_process("--lake", str(lake), "status", name)
        assert "failed" in shown.stdout and TOPIC in shown.stdout
    finally:
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        first.stop()
        if second is not None:
            second.stop()
    landed = _landed(lake, name)
    assert [k for k, n in landed.items() if n > 1] == []  # nothing duplicated
    assert set(landed) == {(partition_id(t, p), o) for t, p, o in produced}  # and nothing else landed

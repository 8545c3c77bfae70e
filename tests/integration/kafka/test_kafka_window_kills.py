"""Issue 25, acceptance 1 over Kafka: every window kind survives random SIGKILLs, from outside.

The campaign of ``tests/integration/test_window_kinds_kills.py`` over a real broker: a topic fed
while ``reclock start`` jobs are SIGKILLed and restarted (2 kills, 8 with ``--long``), then every
window table, read from its ``_delta_log``, equals a polars recomputation over the output, and
the event-time window's late rows are the ones the watermark's definition makes late, once.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.cli import reclock_in_process
from tests.integration.helpers import write_config
from tests.integration.test_window_kinds_kills import (
    check_kinds,
    kill_and_restart,
    restart_until_windows,
    windows,
    with_windows,
)
from tests.waiting import PATIENCE_S


@pytest.mark.usefixtures("reclock_processes")
def test_every_window_kind_over_kafka_equals_a_recomputation_after_random_sigkills(
    tmp_path, long_lane, broker, topic, produce
):
    from reclock.sources.kafka import output_name_for

    t = topic(2)
    stop = threading.Event()

    def feed() -> None:  # records arrive while jobs run and die: many bindings, many windows
        i = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            values = [
                json.dumps(
                    {
                        "k": (i + j) % 5,
                        "s": (i + j) % 997,
                        "v": (i + j) % 97 - 40,
                        "w": i + j,
                        "t": now - (i + j) * 7919 % 400,
                    }
                )
                for j in range(60)
            ]
            values = [v.encode() for v in values]
            produce.send(t, values, partition=lambda j: j % 2)
            i += 60
            time.sleep(0.05)

    lake = tmp_path / "lake"
    config = write_config(
        tmp_path / "k.toml",
        pipeline={"name": "stream", "lake": "lake", "engine": "local", "batch_interval": 0.1, "idle_interval": 0.5},
        source={
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap,
            "topics": [t],
            "format": "json",
            "schema": {"k": "int64", "s": "int64", "v": "int64", "w": "int64", "t": "int64"},
            "read_timeout_s": 5.0,
        },
    )
    output = output_name_for(t)
    defined = windows(output, "k", "t", "s")
    assert reclock_in_process("create", str(with_windows(config, defined))).returncode == 0
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        kill_and_restart(lake, "stream", 8 if long_lane else 2, seed=52)
        restart_until_windows(lake, "stream", output, defined)
    finally:
        stop.set()
        feeder.join(timeout=PATIENCE_S)
    check_kinds(lake, "stream", output, defined)

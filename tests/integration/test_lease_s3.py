"""The job lease across drivers on one S3 lake (moto's server, its own process): refused while the
holder lives, taken over once a paused holder's lease expires, and the paused holder fenced when it
wakes. Checked from outside: the lease object and the tables are read from the server with boto3 and
the independent Delta log reader, against the generator's deterministic records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from reclock.persist.lake import Lake
from reclock.persist.lease import Lease, LeaseHeld
from tests.cli import reclock_in_process
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import expected_generator_offsets, reclock_cli, write_config
from tests.integration.s3 import S3Server, mirror

TTL_S = 4.0
PARTITIONS, LIMIT = 2, 40_000


def _driver(lake_uri: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "reclock.cli", "--lake", lake_uri, "start", "leased"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _object(server: S3Server, bucket: str, key: str) -> dict:
    try:
        return json.loads(server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except server.client().exceptions.NoSuchKey:
        return {}


def _wait(what: str, ready, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.usefixtures("reclock_processes")
def test_a_paused_driver_loses_its_lease_to_a_second_one_and_is_fenced_when_it_resumes(s3_server, tmp_path):
    bucket = s3_server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    env = {**os.environ, **s3_server.environ, "PYSPARK_PYTHON": sys.executable}
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "leased", "lake": lake_uri, "engine": "local", "batch_interval": 0.1, "max_batch": 2_000},
        lease={"ttl_seconds": TTL_S},
        source={"kind": "generator", "partitions": PARTITIONS, "rate": 1_000, "limit": LIMIT},
    )
    created = reclock_in_process("create", str(config), env=env)
    assert created.returncode == 0, created.stderr
    status_key, lease_key = "lake/leased/status.json", "lake/leased/control/lease.json"

    first = _driver(lake_uri, env, tmp_path / "first.log")
    second = None
    try:
        _wait("the first driver's batches", lambda: _object(s3_server, bucket, status_key).get("batches", 0) >= 2)
        assert _object(s3_server, bucket, lease_key)["holder"]["pid"] == first.pid

        # Step 1: while the first driver lives, a second is refused in one line naming it.
        refused = reclock_cli("--lake", lake_uri, "start", "leased", env=env)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"pipeline 'leased' is already running (pid {first.pid}) on " in refused.stderr
        assert "its lease live until " in refused.stderr

        # Step 2: the first driver is paused; its lease stays live until it expires. (Asked in this
        # process: a CLI start takes seconds here, and the lease might expire while it imports.)
        os.killpg(first.pid, signal.SIGSTOP)
        paused_at = time.time()
        lease = _object(s3_server, bucket, lease_key)
        if time.time() * 1000 < lease["expires_ms"] - 1000:
            with pytest.raises(LeaseHeld, match=f"already running \\(pid {first.pid}\\)"):
                Lease.acquire(Lake.at(lake_uri, s3_server.storage_options), "leased", TTL_S)

        # Step 3: once it has expired, a second driver takes over and lands batches.
        time.sleep(max(0.0, lease["expires_ms"] / 1000 - time.time()) + 0.5)
        second = _driver(lake_uri, env, tmp_path / "second.log")
        _wait("the takeover", lambda: _object(s3_server, bucket, lease_key)["holder"]["pid"] == second.pid)
        taken = _object(s3_server, bucket, lease_key)
        assert taken["expires_ms"] > lease["expires_ms"] and not taken["released"]
        _wait(
            "the second driver's batches",
            lambda: (s := _object(s3_server, bucket, status_key)).get("pid") == second.pid and s.get("batches", 0) >= 2,
        )
        assert time.time() - paused_at >= TTL_S
        landed = _object(s3_server, bucket, status_key)
        assert not landed.get("finished"), "the second driver finished before the first one woke: nothing to fence"

        # Step 4: the first driver wakes; it must stop without duplicating anything.
        os.killpg(first.pid, signal.SIGCONT)
        assert first.wait(timeout=120) == 1
        fenced = (tmp_path / "first.log").read_text()
        assert f"pid {first.pid}" in fenced and "lost its lease" in fenced, fenced[-2000:]
        assert _object(s3_server, bucket, lease_key)["holder"]["pid"] == second.pid
        assert second.poll() is None or second.returncode == 0, (tmp_path / "second.log").read_text()[-2000:]

        assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-2000:]
    finally:
        for driver in (first, second):
            if driver is not None and driver.poll() is None:
                os.killpg(driver.pid, signal.SIGCONT)
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=30)
    final = _object(s3_server, bucket, status_key)
    assert (final["pid"], final["health"], final["finished"]) == (second.pid, "stopped", True)
    assert _object(s3_server, bucket, lease_key)["released"]

    # From outside: every generated record in exactly one row, stamped by the durable bindings.
    copy = mirror(s3_server, bucket, "lake/leased", tmp_path / "mirror")
    remap = Remap.read(copy / "remap")
    for output, keys in expected_generator_offsets(PARTITIONS, LIMIT).items():
        rows = read_rows(DeltaLog(copy / "outputs" / output).refresh(), ["_partition", "_offset", "_into_ts"])
        got = Counter(zip(rows.column("_partition").to_pylist(), rows.column("_offset").to_pylist(), strict=True))
        assert not [k for k, n in got.items() if n > 1], f"{output}: duplicated rows"
        assert set(got) == keys, f"{output}: missing {len(keys - set(got))}, unexpected {len(set(got) - keys)}"
        wrong = [r for r in rows.to_pylist() if not remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"])]
        assert not wrong, f"{output}: rows stamped against the bindings: {wrong[:3]}"
    assert read_rows(DeltaLog(copy / "outputs" / "_errors").refresh()).num_rows == 0

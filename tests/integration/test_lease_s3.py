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
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from reclock.persist import conditional
from reclock.persist.lake import Lake
from reclock.persist.lease import Lease, LeaseHeld
from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.proxy import FaultProxy
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import expected_generator_offsets, reclock_cli, write_config
from tests.integration.s3 import S3Server, mirror
from tests.waiting import PATIENCE_S

TTL_S = 4.0
PARTITIONS, LIMIT = 2, 40_000


def _driver(lake_uri: str, env: dict[str, str], log: Path, name: str = "leased") -> subprocess.Popen:
    with open(log, "w") as err:
        return zygote.popen(
            ["--lake", lake_uri, "start", name],
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


@pytest.mark.waits
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
                driver.wait(timeout=PATIENCE_S)
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


def _objects(server: S3Server, bucket: str) -> dict[str, tuple[str, object]]:
    """Every object in the bucket, with its ETag and LastModified: what a write would change."""
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: (o["ETag"], o["LastModified"]) for page in pages for o in page.get("Contents", [])}


def _settle(server: S3Server, bucket: str, *, besides: tuple[str, ...], quiet_s: float = 2.0) -> None:
    """Until no object but ``besides`` (what a running driver rewrites while idle: its lease, its
    status snapshot) has changed for ``quiet_s`` seconds: its writes in flight have landed. A
    status flush creates five tables one after another, which on a loaded machine took longer
    than the driver's idle seconds."""

    def written() -> dict[str, tuple[str, object]]:
        return {key: seen for key, seen in _objects(server, bucket).items() if key not in besides}

    deadline = time.monotonic() + 60
    seen, since = written(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the driver kept writing while idle"
        time.sleep(0.25)
        now = written()
        if now != seen:
            seen, since = now, time.monotonic()


def _drop(folder: Path, n: int, rows: int = 40) -> set[int]:
    """File ``f<n>.csv`` of ``rows`` rows with ids ``n * 1000 + i``, appearing whole; the ids."""
    ids = {n * 1000 + i for i in range(rows)}
    tmp = folder / f".f{n}.tmp"
    tmp.write_text("id,name\n" + "".join(f"{i},name-{i}\n" for i in sorted(ids)))
    tmp.rename(folder / f"f{n}.csv")
    return ids


@pytest.mark.usefixtures("reclock_processes")
def test_a_driver_fenced_by_a_takeover_writes_not_one_object_when_it_resumes(s3_server, tmp_path):
    """Nothing a driver that lost its lease does may reach the lake: no commit, no status row,
    no status snapshot. The oracle is the bucket itself: the first driver is paused while idle
    (every file it was given has landed and its status rows are flushed, so no write of it is in
    flight), a second driver takes over once the lease expires and writes its own snapshot, then
    is paused in turn; the bucket is listed, the first driver resumes until it exits, and the
    bucket is listed again. Only the first driver ran in between: every difference is its write.

    Both drivers reach the server through a proxy (:mod:`tests.faults.proxy`) that, once the
    first resumes, forwards its lease writes 3 s late: it learns of the takeover late, as over a
    slow network, and what it does meanwhile must reach nothing either."""
    bucket = s3_server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    proxy = FaultProxy(s3_server.port)
    env = {**os.environ, **s3_server.environ, "AWS_ENDPOINT_URL": proxy.endpoint, "PYSPARK_PYTHON": sys.executable}
    folder = tmp_path / "in"
    folder.mkdir()
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": "fenced", "lake": lake_uri, "engine": "local", "batch_interval": 0.1, "idle_interval": 3600},
        lease={"ttl_seconds": TTL_S},
        source={"kind": "files", "path": str(folder), "columns": {"id": "int64", "name": "string"}},
    )
    assert reclock_in_process("create", str(config), env=env).returncode == 0
    status_key, lease_key = "lake/fenced/status.json", "lake/fenced/control/lease.json"
    ids = set().union(*(_drop(folder, n) for n in range(3)))

    def loaded() -> int:
        """Rows the running driver says it loaded."""
        return sum(_object(s3_server, bucket, status_key).get("rows", {}).values())

    first = _driver(lake_uri, env, tmp_path / "first.log", "fenced")
    second = None
    try:
        _wait("the first driver's rows", lambda: loaded() == len(ids))
        time.sleep(3)  # idle: its status rows flushed (every second), nothing of it in flight
        _settle(s3_server, bucket, besides=(status_key, lease_key))  # on a loaded machine too
        os.killpg(first.pid, signal.SIGSTOP)
        lease = _object(s3_server, bucket, lease_key)
        time.sleep(max(0.0, lease["expires_ms"] / 1000 - time.time()) + 0.5)

        second = _driver(lake_uri, env, tmp_path / "second.log", "fenced")
        _wait("the takeover", lambda: _object(s3_server, bucket, lease_key)["holder"]["pid"] == second.pid)
        _wait("the second driver's snapshot", lambda: _object(s3_server, bucket, status_key).get("health") == "running")
        time.sleep(2)  # its start-up status rows flushed
        os.killpg(second.pid, signal.SIGSTOP)
        time.sleep(1)  # what it had sent lands now, not while the first driver runs
        before = _objects(s3_server, bucket)

        lease_write = f"PUT /{bucket}/{lease_key} ".encode()
        proxy.hold(lambda data: data.startswith(lease_write), 3.0)
        os.killpg(first.pid, signal.SIGCONT)
        assert first.wait(timeout=120) == 1
        fenced = (tmp_path / "first.log").read_text()
        assert "lost its lease" in fenced, fenced[-2000:]
        after = _objects(s3_server, bucket)
        written = sorted(k for k in after if before.get(k) != after[k])
        removed = sorted(k for k in before if k not in after)
        assert not written and not removed, f"the fenced driver wrote {written}, removed {removed}"
        assert _object(s3_server, bucket, status_key)["pid"] == second.pid

        proxy.hold(None)
        os.killpg(second.pid, signal.SIGCONT)
        ids |= _drop(folder, 3)
        _wait("the new file", lambda: loaded() == 40)
        assert reclock_cli("--lake", lake_uri, "stop", "fenced", env=env).returncode == 0
        assert second.wait(timeout=120) == 0, (tmp_path / "second.log").read_text()[-2000:]
    finally:
        for driver in (first, second):
            if driver is not None and driver.poll() is None:
                os.killpg(driver.pid, signal.SIGCONT)
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(timeout=PATIENCE_S)
        proxy.close()
    final = _object(s3_server, bucket, status_key)
    assert (final["pid"], final["health"]) == (second.pid, "stopped")
    copy = mirror(s3_server, bucket, "lake/fenced", tmp_path / "mirror")
    got = Counter(read_rows(DeltaLog(copy / "outputs" / "rows").refresh(), ["id"]).column("id").to_pylist())
    assert not [i for i, n in got.items() if n > 1] and set(got) == ids


def test_the_lease_signs_with_an_instance_role_when_the_lake_names_no_credentials(s3_server, tmp_path, monkeypatch):
    """A job on a cloud machine reaches S3 with its instance role, keys in no configuration: the
    lease finds them where every AWS SDK does (delta-rs and pyarrow too). moto's server plays the
    instance metadata service; the lease's requests, read off the wire, are signed with its key."""
    from tests.store_recorder import StoreRecorder

    for name in ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN", "PROFILE", "DEFAULT_PROFILE"):
        monkeypatch.delenv(f"AWS_{name}", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", s3_server.endpoint)
    roles = f"{s3_server.endpoint}/latest/meta-data/iam/security-credentials/"
    with urllib.request.urlopen(roles, timeout=PATIENCE_S) as listed:
        role = listed.read().decode().split()[0]
    with urllib.request.urlopen(roles + role, timeout=PATIENCE_S) as found:
        role_credentials = json.loads(found.read())

    with StoreRecorder() as store:
        lake = Lake.at("s3://bucket/lake", {"endpoint": store.endpoint, "region": "eu-central-1"})
        store.answer(200, etag='"v1"')
        assert conditional.put(lake.store, lake.lease_path("roled"), '{"lease": 1}', None) == '"v1"'
        (request,) = store.requests
    assert request.headers["If-None-Match"] == "*"
    assert request.signed_by(
        role_credentials["AccessKeyId"], role_credentials["SecretAccessKey"], role_credentials["Token"], "eu-central-1"
    ), request.headers.get("Authorization")

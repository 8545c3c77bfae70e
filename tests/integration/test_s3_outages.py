"""An S3 lake that refuses connections or hangs, at random, while ``reclock start`` runs.

The store is moto's server process; between it and the job sits :class:`tests.faults.proxy.FaultProxy`,
a TCP proxy in this process that the campaign switches at random moments between *up*, *refusing*
(nothing listens: every connection is refused, open ones are reset, as when the server is down) and
*paused* (connections hang, as when it is frozen). Every kind of lake I/O fails in some of those
windows: data files, output commits, remap bindings, the lease's conditional PUTs, the status
tables and the status file.

One test fails exactly one write, a binding's, and keeps the store away for 15 s; the other is
a campaign of refusals and pauses at random moments. The job must never exit while the store is
away: a storage error anywhere is transient, so the
job stalls (it logs ``stalled`` with the error and a hint) and goes on where it was once the
store answers. Afterwards the generator's every record is in its output exactly once, stamped by
the durable bindings, and nothing is in ``_errors``: checked with boto3 straight from the server
(not through the proxy) and the independent Delta log reader.

``scripts/test --long`` (the ``long_lane`` fixture) runs the long campaign (more and longer outages)
instead of the short one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import zygote
from tests.cli import reclock_in_process
from tests.faults.proxy import FaultProxy
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import expected_generator_offsets, write_config
from tests.integration.s3 import S3Server, mirror
from tests.waiting import PATIENCE_S

pytestmark = [pytest.mark.usefixtures("reclock_processes")]

PARTITIONS, RATE = 2, 400


@dataclass(frozen=True)
class Campaign:
    """How many outages, how long each lasts at most, and the service between them at most."""

    outages: int
    longest: float
    between: float

    def faults(self, rng: random.Random) -> list[str]:
        """Refusals and pauses in random order; a short campaign has one of each."""
        if self.outages == 2:
            return rng.sample(["refuse", "pause"], 2)
        return [rng.choice(["refuse", "pause"]) for _ in range(self.outages)]

    @property
    def seconds(self) -> float:
        """Longer than the campaign lasts: the generator is mid-stream at every outage."""
        return self.outages * (self.longest + self.between) + 8


#: The default lane's campaign, and ``--long``'s.
SHORT, LONG = Campaign(2, 3.0, 1.5), Campaign(24, 8.0, 4.0)


def _outage_campaign(
    proxy: FaultProxy, job: subprocess.Popen, rng: random.Random, log: Path, campaign: Campaign
) -> list[str]:
    """Refusals and pauses of random lengths at random moments; the job must live through them."""
    done = []
    for fault in campaign.faults(rng):
        seconds = rng.uniform(1.0, campaign.longest)
        getattr(proxy, fault)()
        time.sleep(seconds)
        proxy.up()
        done.append(f"{fault} {seconds:.1f} s")
        assert job.poll() is None, f"the job exited during the outages ({done}):\n{log.read_text()[-4000:]}"
        time.sleep(rng.uniform(0.5, campaign.between))
        assert job.poll() is None, f"the job exited after the outages ({done}):\n{log.read_text()[-4000:]}"
    return done


def _wait(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _has_rows(server: S3Server, bucket: str) -> bool:
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix="lake/outages/outputs/bids/_delta_log/")
    return any(item["Key"].endswith("00000000000000000001.json") for item in listed.get("Contents", []))


def _start(server: S3Server, proxy: FaultProxy, tmp_path: Path, seconds: float) -> tuple[subprocess.Popen, str, int]:
    """``reclock start`` of a generator pipeline on a new bucket through ``proxy``, generating for
    ``seconds``: the job, its bucket and the generator's limit (the ground truth)."""
    bucket = server.bucket()
    lake_uri = f"s3://{bucket}/lake"
    env = {**os.environ, **server.environ, "AWS_ENDPOINT_URL": proxy.endpoint, "PYSPARK_PYTHON": sys.executable}
    limit = round(RATE * seconds)
    config = write_config(
        tmp_path / "p.toml",
        pipeline={
            "name": "outages",
            "lake": lake_uri,
            "engine": "local",
            "batch_interval": 0.1,
            "max_batch": 2_000,
            "retry_backoff": 0.2,
            "max_backoff": 2.0,
        },
        lease={"ttl_seconds": 6.0},  # shorter than the longest outage: a lease that expires meanwhile
        source={"kind": "generator", "partitions": PARTITIONS, "rate": RATE, "limit": limit},
    )
    created = reclock_in_process("create", str(config), env=env)
    assert created.returncode == 0, created.stderr
    with open(tmp_path / "job.log", "w") as err:
        job = zygote.popen(
            ["--lake", lake_uri, "start", "outages"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    return job, bucket, limit


#: What the job logs when an outage reached it: a stall, or (a short outage that the clients'
#: own retries bridged for the batch) a status or lease write it could not make. A short
#: campaign's outage may be bridged whole by the clients' retries: then the proxy's count of the
#: connections the outages met (:attr:`FaultProxy.met`) says that they reached the job.
STALLED, MET = ("stalled, will retry",), ("stalled, will retry", "could not publish its status", "could not renew")


def _finish(
    job: subprocess.Popen, proxy: FaultProxy, timeout: float, log: Path, why: str, reached: tuple[str, ...] = STALLED
) -> str:
    """Wait for the job to finish (exit 0) with the store up; its log, which must say that the
    outage reached the job (one of ``reached``), or the test proved nothing."""
    proxy.up()
    try:
        assert job.wait(timeout=timeout) == 0, f"{why}:\n{log.read_text()[-4000:]}"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=PATIENCE_S)
        proxy.close()
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    met = bool(proxy.met) and reached is MET  # a short outage the clients' retries bridged
    assert met or any(line in text for line in reached), (
        f"no outage reached the job: the test proved nothing:\n{text[-4000:]}"
    )
    return text


def _check_exactly_once(server: S3Server, bucket: str, limit: int, copy: Path, why: str) -> None:
    """From outside, straight from the server: every generated record once, stamped by the bindings."""
    mirror(server, bucket, "lake/outages", copy)
    remap = Remap.read(copy / "remap")
    for output, keys in expected_generator_offsets(PARTITIONS, limit).items():
        rows = read_rows(DeltaLog(copy / "outputs" / output).refresh(), ["_partition", "_offset", "_into_ts"])
        got = Counter(zip(rows.column("_partition").to_pylist(), rows.column("_offset").to_pylist(), strict=True))
        assert not [k for k, n in got.items() if n > 1], f"{why}: {output}: duplicated rows"
        assert set(got) == keys, f"{why}: {output}: missing {len(keys - set(got))}, extra {len(set(got) - keys)}"
        wrong = [r for r in rows.to_pylist() if not remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"])]
        assert not wrong, f"{why}: {output}: rows stamped against the bindings: {wrong[:3]}"
    errors = read_rows(DeltaLog(copy / "outputs" / "_errors").refresh())
    assert errors is None or errors.num_rows == 0, f"{why}: an outage is not bad data: {errors.to_pylist()[:3]}"


def test_a_store_refusing_from_a_bindings_write_on_stalls_the_job_until_it_answers(s3_server, tmp_path):
    """The outage begins exactly at the first write of a binding, so the remap view is unsure and
    must be re-read before the loop can say whether the pipeline finished: that re-read, while the
    store still refuses, is a storage error like any other (it once ended the job with exit 1)."""
    proxy = FaultProxy(s3_server.port)
    job, bucket, limit = _start(s3_server, proxy, tmp_path, 10)
    try:
        _wait("the first batch", lambda: _has_rows(s3_server, bucket), 120)
        remap_write = f" /{bucket}/lake/outages/remap/part-".encode()
        fired = proxy.refuse_at(lambda data: data.startswith((b"PUT ", b"POST ")) and remap_write in data[:300])
        _wait("a binding's write", fired.is_set, 60)
        for _ in range(30):  # 15 s of refusals: many attempts, the lease expiring meanwhile
            time.sleep(0.5)
            assert job.poll() is None, f"the job exited:\n{(tmp_path / 'job.log').read_text()[-4000:]}"
    finally:
        _finish(job, proxy, 300, tmp_path / "job.log", "after the refusal")
    _check_exactly_once(s3_server, bucket, limit, tmp_path / "mirror", "after the refusal")


def test_a_store_refusing_while_the_job_opens_its_tables_stalls_the_start_until_it_answers(s3_server, tmp_path):
    """The outage begins at the job's first write of an output table, while it opens its tables
    under its new lease: start-up's lake I/O is as transient as a batch's (it once ended the job
    with exit 1: 'creating output table ...: Connection refused'). Refused for longer than the
    lease lasts, so the job renews it meanwhile, or takes it back."""
    proxy = FaultProxy(s3_server.port)
    job, bucket, limit = _start(s3_server, proxy, tmp_path, 4)
    try:
        table_write = f" /{bucket}/lake/outages/outputs/".encode()
        fired = proxy.refuse_at(lambda data: data.startswith((b"PUT ", b"POST ")) and table_write in data[:300])
        _wait("an output table's first write", fired.is_set, 60)
        for _ in range(16):  # 8 s of refusals
            time.sleep(0.5)
            assert job.poll() is None, f"the job exited:\n{(tmp_path / 'job.log').read_text()[-4000:]}"
    finally:
        _finish(job, proxy, 300, tmp_path / "job.log", "after the refusal at start-up")
    _check_exactly_once(s3_server, bucket, limit, tmp_path / "mirror", "after the refusal at start-up")


def test_the_job_stalls_through_refusals_and_pauses_of_the_store_and_lands_everything_once(
    s3_server, tmp_path, long_lane
):
    seed = int(os.environ.get("RECLOCK_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    campaign = LONG if long_lane else SHORT
    proxy = FaultProxy(s3_server.port)
    job, bucket, limit = _start(s3_server, proxy, tmp_path, campaign.seconds)
    log = tmp_path / "job.log"
    done: list[str] = []
    try:
        _wait("the first batch", lambda: _has_rows(s3_server, bucket), 120)
        done = _outage_campaign(proxy, job, rng, log, campaign)
    finally:
        _finish(job, proxy, campaign.seconds + 240, log, f"seed {seed}, {done}", STALLED if long_lane else MET)
    _check_exactly_once(s3_server, bucket, limit, tmp_path / "mirror", f"seed {seed}, {done}")

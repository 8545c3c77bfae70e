"""What a pipeline costs in S3 requests, counted on the wire by a proxy in front of moto's server.

Every request to a real object store takes 10-50 ms and is billed, so the count is part of the
contract (``docs/design/20261125_s3_requests_per_batch.md``):

* a batch costs about what its commits must: per table it commits to (the remap table and each
  output), about what one ``write_deltalake`` append on a table held open costs, measured here on
  the same server, and that cost does not grow with the pipeline's age;
* an idle job looks for a stop request at the batch cadence, renews its lease and keeps its status
  fresh, and makes no other request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.job.control import request_stop
from reclock.persist.lake import Lake
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.settings import Maintenance, Settings
from reclock.sources.generator import GeneratorSource
from tests.integration.s3 import S3Server
from tests.integration.s3_requests import CountingProxy, Requests
from tests.waiting import PATIENCE_S

#: Batches counted at each age, and batches stepped between the two ages: the default lane's and
#: ``--long``'s. Ages 10,000 and beyond are the benchmark's (``python -m benchmarks run s3_requests``).
SHORT, LONG = (8, 16), (20, 40)


@pytest.fixture
def proxy(s3_server):
    counting = CountingProxy(s3_server.endpoint)
    yield counting
    counting.stop()


def _lake(server: S3Server, proxy: CountingProxy) -> Lake:
    """A new lake whose every request goes through ``proxy``."""
    return Lake.at(f"s3://{server.bucket()}/lake", {**server.storage_options, "endpoint": proxy.endpoint})


def _counted(proxy: CountingProxy, work: Callable[[], object]) -> Requests:
    before = proxy.counts()
    work()
    after = proxy.counts()
    after.subtract(before)
    return after


def _user_append(lake: Lake, proxy: CountingProxy, appends: int = 5) -> Requests:
    """What one append costs a user who holds a Delta table open: ``write_deltalake`` on it."""
    path = str(lake.root / "user")
    rows = pa.table({"id": pa.array(range(400), pa.int64()), "payload": ["x" * 40] * 400})
    write_deltalake(path, rows, mode="append", storage_options=lake.store.delta_options)
    table = DeltaTable(path, storage_options=lake.store.delta_options)
    counted = _counted(proxy, lambda: [write_deltalake(table, rows, mode="append") for _ in range(appends)])
    return Requests({kind: n / appends for kind, n in counted.items()})


def test_a_batch_costs_what_its_commits_must_and_no_more_as_the_pipeline_ages(s3_server, proxy, long_lane):
    window, between = LONG if long_lane else SHORT
    lake = _lake(s3_server, proxy)
    user = _user_append(lake, proxy)
    clock = [1_700_000_000_000]

    def now() -> int:
        clock[0] += 1000
        return clock[0]

    pipeline = Pipeline(
        "cost",
        lake,
        GeneratorSource(partitions=2, limit=10**9),
        settings=Settings(max_batch=400, idle_interval=0),
        maintenance=Maintenance(every=0),
        now=now,
    )
    tables = 1 + len(pipeline.sinks)  # the remap table and every output commit once a batch

    def counted_window() -> Requests:
        counted = _counted(proxy, lambda: [pipeline.step() for _ in range(window)])
        return Requests({kind: n / window for kind, n in counted.items()})

    young = counted_window()  # ages 0 to 8 (20 with --long)
    for _ in range(between):
        pipeline.step()
    old = counted_window()  # ages 24 to 32 (60 to 80): that many log entries per table, none checkpointed

    # A user's append is one data file and one commit; a batch writes the data files its splits
    # make (one per split and output, and the remap table's), and commits once per table.
    per_commit = user.total() - user["PUT data"]
    for age, batch in ((f"0-{window}", young), (f"{window + between}-{2 * window + between}", old)):
        floor = tables * per_commit + batch["PUT data"]
        assert batch.total() <= 2 * floor, f"ages {age}: {batch.total():.1f} a batch, floor {floor:.1f}: {batch}"
        reads = batch.total("GET") + batch.total("LIST") + batch.total("HEAD")
        user_reads = user.total("GET") + user.total("LIST") + user.total("HEAD")
        assert reads <= 2 * tables * user_reads, f"ages {age}: {reads:.1f} reads a batch vs {user_reads:.1f} a commit"
        # Each table's log is listed no more often than a user's append lists it: delta-rs's look for
        # expired entries is made at checkpoints only (reclock.persist.post_commit), not every commit.
        lists = batch.total("LIST")
        assert lists <= tables * user.total("LIST"), f"ages {age}: {lists:.1f} LISTs a batch: {batch}"
    assert old.total("GET") <= 1.25 * young.total("GET"), f"GETs grow with age: {young} then {old}"
    assert old.total("LIST") <= 1.25 * young.total("LIST"), f"LISTs grow with age: {young} then {old}"


def test_an_idle_job_makes_only_the_requests_of_its_cadence_and_still_stops_on_request(s3_server, proxy, long_lane):
    lake = _lake(s3_server, proxy)
    far = 4_102_444_800_000  # 2100: the generator's data starts then, so the job stays idle
    config = parse_config(
        {
            "pipeline": {"name": "idle", "lake": lake.uri, "engine": "local", "idle_interval": 3600},
            "source": {"kind": "generator", "partitions": 2, "rate": 1000, "anchor_ms": far},
        }
    )
    lifecycle.create(config, storage_options={**s3_server.storage_options, "endpoint": proxy.endpoint})
    job = threading.Thread(target=lifecycle.run, args=(lake, "idle"), daemon=True)
    job.start()
    bucket, key = lake.root.bucket, f"{lake.root.key}/idle/status.json"
    try:
        deadline = time.monotonic() + 60
        while _status(s3_server, bucket, key).get("batches", 0) < 1:  # its first binding, time only
            assert time.monotonic() < deadline, "the job did not bind its first (time-only) batch"
            time.sleep(0.1)
        time.sleep(5)  # the status tables' first flush and first maintenance: start-up, not idling
        seconds = 20 if long_lane else 10
        idle = _counted(proxy, lambda: time.sleep(seconds))
    finally:
        request_stop(Lake.at(lake.uri, s3_server.storage_options), "idle")  # straight to the server
        job.join(timeout=PATIENCE_S)
    # Seen inside the idle wait of 3600 s, which outlasts the patience: the job looks for it there.
    assert not job.is_alive(), "the job did not stop on request"
    polls = idle.total("HEAD stop") + idle.total("LIST stop")
    assert polls <= seconds / 1.0 + 2, f"{polls} looks for a stop request in {seconds} s: {idle}"
    per_minute = idle.total() * 60 / seconds
    cadence = 60 / 1.0  # one idle step a batch_interval
    assert per_minute <= 2 * cadence, f"{per_minute:.0f} requests a minute while idle: {idle}"


def _status(server: S3Server, bucket: str, key: str) -> dict:
    """The job's status snapshot, read from the server itself (not through the counting proxy)."""
    try:
        return json.loads(server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    except server.client().exceptions.NoSuchKey:
        return {}

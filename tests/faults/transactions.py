"""Kill campaign over a transactional topic: concurrent confluent-kafka transactional producers
commit and abort at random while a ``reclock start`` job reading ``read_committed`` is SIGKILLed
at random moments and started again.

Ground truth is what the producers were told: a transaction's records and their delivery
coordinates, whether it was committed or aborted, and the wall-clock millisecond at which
``commit_transaction`` / ``abort_transaction`` was *called* (its marker is written after that).
Checked at the end, reading the lake without the product (:mod:`tests.faults.reader`):

* every record of every committed transaction is in the output exactly once, at its delivered
  partition and offset, with its payload; no record of an aborted transaction is;
* no record landed before its transaction's commit was called: its ``_into_ts`` (the binding
  that covered it) is at or after that call;
* the upper never passed an open transaction: no durable binding of a time before a
  transaction's commit call covers that transaction's first offset in any partition;
* every row's ``_into_ts`` is what the durable bindings say.

What this campaign can and cannot prove on Tansu: Tansu never lists aborted transactions in a
Fetch response, so a record of an aborted transaction that reached its log would read as
committed to every ``read_committed`` client. The aborting producers therefore abort before their
records are flushed (``linger.ms`` is long), so aborted records never reach the broker, and the
campaign checks that from the raw log. It proves the commit side under kills: open transactions
hold the upper, commit markers take offsets without gaps or rereads, committed records land once.
The aborted-transaction path is proved by ``tests/unit/test_kafka_transactions.py``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from reclock.persist.lake import Lake
from reclock.sources.kafka import output_name_for
from reclock.timeline.frontier import Frontier
from tests import zygote
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import write_config
from tests.waiting import PATIENCE_S

__all__ = ["Campaign", "run_campaign"]

PARTITIONS = 3
SCHEMA = {"id": "int64", "producer": "string", "txn": "int64"}


@dataclass
class Txn:
    producer: str
    number: int
    outcome: str  # "commit" | "abort"
    decided_ms: int  # wall clock when commit/abort was called
    delivered: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (partition, offset)


@dataclass
class Campaign:
    kills: int = 4
    producers: int = 3
    seed: int = 23
    commit_share: float = 0.6
    #: How long a committing transaction stays open after its records are in the log, at most
    #: (the first producer holds its transactions open longer: kills land inside them).
    hold_s: float = 0.4
    long_hold_s: float = 2.5


class Feed(threading.Thread):
    """One transactional producer: transactions of 1-8 records over random partitions."""

    def __init__(self, bootstrap: str, topic: str, index: int, campaign: Campaign) -> None:
        super().__init__(daemon=True, name=f"txn-feed-{index}")
        self.bootstrap, self.topic, self.index, self.campaign = bootstrap, topic, index, campaign
        self.rng = random.Random(campaign.seed * 100 + index)
        self.stop = threading.Event()
        self.txns: list[Txn] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        import logging

        from confluent_kafka import Producer

        quiet = logging.getLogger("tests.librdkafka")
        quiet.setLevel(logging.ERROR)
        name = f"{self.topic}-p{self.index}"
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": name, "linger.ms": 5000, "logger": quiet}
        )
        hold = self.campaign.long_hold_s if self.index == 0 else self.campaign.hold_s
        try:
            producer.init_transactions(30)
            number = 0
            while not self.stop.is_set():
                number += 1
                commit = self.rng.random() < self.campaign.commit_share
                txn = Txn(name, number, "commit" if commit else "abort", 0)
                producer.begin_transaction()
                for k in range(self.rng.randint(1, 8)):
                    record_id = (self.index * 1_000_000 + number) * 100 + k
                    value = json.dumps({"id": record_id, "producer": name, "txn": number}).encode()

                    def delivered(err, msg, record_id=record_id, txn=txn) -> None:
                        if err is None:
                            txn.delivered[record_id] = (msg.partition(), msg.offset())

                    producer.produce(self.topic, value, partition=self.rng.randrange(PARTITIONS), on_delivery=delivered)
                if commit:
                    assert producer.flush(30) == 0  # in the log now, the transaction still open
                    time.sleep(self.rng.uniform(0, hold))
                    txn.decided_ms = int(time.time() * 1000)
                    producer.commit_transaction(30)
                else:  # before any flush: the records are purged, never sent (see the module doc)
                    time.sleep(self.rng.uniform(0, 0.2))
                    txn.decided_ms = int(time.time() * 1000)
                    producer.abort_transaction(30)
                producer.poll(0)
                self.txns.append(txn)
                time.sleep(self.rng.uniform(0, 0.05))
        except BaseException as exc:
            self.failure = exc


@dataclass
class Report:
    kills: int = 0
    committed_txns: int = 0
    aborted_txns: int = 0
    committed_records: int = 0
    rows: int = 0
    bindings: int = 0
    problems: list[str] = field(default_factory=list)


def run_campaign(bootstrap: str, topic: str, work: Path, campaign: Campaign) -> Report:
    """Feed, kill, catch up and check (see the module doc); the report lists every broken promise."""
    from tests.integration.kafka.test_kafka_transactions import Raw

    name, lake = "txns", work / "lake"
    config = write_config(
        work / "txns.toml",
        pipeline={"name": name, "lake": "lake", "engine": "local", "max_batch": 400, "batch_interval": 0.05},
        source={
            "kind": "kafka",
            "bootstrap_servers": bootstrap,
            "topics": [topic],
            "format": "json",
            "schema": SCHEMA,
            "read_timeout_s": 5.0,
        },
    )
    created = zygote.run(["create", str(config)], capture_output=True, text=True)
    assert created.returncode == 0, created.stderr
    rng = random.Random(campaign.seed)
    feeds = [Feed(bootstrap, topic, i, campaign) for i in range(campaign.producers)]
    for feed in feeds:
        feed.start()
    report = Report()
    stderr = work / "job.stderr"
    try:
        for _ in range(campaign.kills):
            job = _start(lake, name, stderr)
            time.sleep(rng.uniform(1.2, 3.5))
            _kill(job)
            report.kills += 1
    finally:
        for feed in feeds:
            feed.stop.set()
        for feed in feeds:
            feed.join(timeout=60)
    for feed in feeds:
        assert feed.failure is None, f"{feed.name}: {feed.failure!r}"
    raw = Raw(bootstrap)
    try:
        log = {p: _whole_log(raw, topic, p) for p in range(PARTITIONS)}
    finally:
        raw.close()
    ends = {p: answer[0] for p, answer in log.items()}
    job = _start(lake, name, stderr)
    try:
        _wait_until_in(lake, name, topic, ends)
        assert _cli(lake, "stop", name, "--wait", f"{PATIENCE_S:.0f}").returncode == 0
        assert job.wait(timeout=60) == 0, stderr.read_text()[-3000:]
    finally:
        _kill(job)
    _check(report, [t for feed in feeds for t in feed.txns], log, lake, name, topic)
    return report


def _check(report: Report, txns: list[Txn], log: dict, lake: Path, name: str, topic: str) -> None:
    committed = [t for t in txns if t.outcome == "commit"]
    report.committed_txns, report.aborted_txns = len(committed), len(txns) - len(committed)
    want: dict[tuple[str, int], tuple[int, Txn]] = {}
    for txn in committed:
        if len(txn.delivered) == 0:
            report.problems.append(f"committed transaction {txn.producer}#{txn.number} has no delivery")
        for record_id, (p, offset) in txn.delivered.items():
            want[(_pid(topic, p), offset)] = (record_id, txn)
    report.committed_records = len(want)
    # What Tansu's log holds: exactly the committed records (aborted ones never reached it).
    in_log = {(_pid(topic, p), o): record_id for p, (_, records) in log.items() for o, record_id in records}
    if in_log != {k: v[0] for k, v in want.items()}:
        extra = sorted(set(in_log) - set(want))[:5]
        report.problems.append(
            f"the raw log is not exactly the committed records (extra {extra}): an aborted record reached "
            "Tansu, which no read_committed client can tell from a committed one there"
        )
    output = Lake.at(lake).output_path(name, output_name_for(topic))
    table = read_rows(DeltaLog(output).refresh(), ["id", "_partition", "_offset", "_into_ts"])
    rows = table.to_pylist() if table is not None else []
    report.rows = len(rows)
    seen = Counter((r["_partition"], r["_offset"]) for r in rows)
    report.problems += [f"duplicated {k}" for k, n in seen.items() if n > 1][:5]
    report.problems += [f"lost {k}" for k in sorted(set(want) - set(seen))][:5]
    report.problems += [f"unexpected row {k}" for k in sorted(set(seen) - set(want))][:5]
    remap = Remap.read(Lake.at(lake).remap_path(name))
    report.bindings = len(remap.times)
    for r in rows:
        key = (r["_partition"], r["_offset"])
        if key not in want:
            continue
        record_id, txn = want[key]
        if r["id"] != record_id:
            report.problems.append(f"wrong payload at {key}: {r['id']} != {record_id}")
        if r["_into_ts"] < txn.decided_ms:
            report.problems.append(f"{key} landed at {r['_into_ts']}, before its commit was called at {txn.decided_ms}")
        if not remap.stamp_holds(key[0], key[1], r["_into_ts"]):
            report.problems.append(f"{key} stamped {r['_into_ts']}, the bindings say {remap.stamp(*key)}")
    firsts: dict[str, list[tuple[int, int]]] = {}  # partition -> (first offset, decided) per transaction
    for txn in committed:
        by_partition: dict[int, int] = {}
        for p, offset in txn.delivered.values():
            by_partition[p] = min(offset, by_partition.get(p, offset))
        for p, first in by_partition.items():
            firsts.setdefault(_pid(topic, p), []).append((first, txn.decided_ms))
    for time_ in remap.times:
        frontier = remap.frontier_at(time_)
        for partition, txn_firsts in firsts.items():
            upper = frontier.get(partition, 0)
            passed = [(f, d) for f, d in txn_firsts if upper > f and time_ < d]
            if passed:
                report.problems.append(
                    f"binding at {time_} has {partition} at {upper}, past the first offset {passed[0][0]} of a "
                    f"transaction committed only at {passed[0][1]}"
                )


def _whole_log(raw, topic: str, partition: int) -> tuple[int, list[tuple[int, int]]]:
    """``(high watermark, [(offset, id)])`` of every data record in the partition, read
    uncommitted: everything the broker holds."""
    records: list[tuple[int, int]] = []
    position, end = 0, None
    while end is None or position < end:
        answer = raw.fetch(topic, partition, position, committed=False)
        end = answer.high_watermark
        for batch in answer.batches:
            if not batch.control:
                offsets = range(batch.base, batch.last + 1)
                records += [(o, json.loads(v)["id"]) for o, v in zip(offsets, batch.values, strict=True)]
            position = max(position, batch.last + 1)
        if not answer.batches:
            break
    return end, records


def _pid(topic: str, partition: int) -> str:
    """A partition as output and remap rows spell it: a compact JSON list."""
    return json.dumps([topic, partition], separators=(",", ":"))


def _wait_until_in(lake: Path, name: str, topic: str, ends: dict[int, int], timeout: float = 120.0) -> None:
    """Until the job's published resume frontier (what every output holds) reaches ``ends``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = json.loads(Lake.at(lake).status_path(name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            status = {}
        resume = Frontier.from_json(status.get("resume_frontier", "{}"))
        if all(resume.covers((topic, p), end - 1) for p, end in ends.items() if end > 0):
            return
        assert time.monotonic() < deadline, f"not caught up: {resume!r} vs {ends}"
        time.sleep(0.2)


def _cli(lake: Path, *args: str) -> subprocess.CompletedProcess:
    return zygote.run(["--lake", str(lake), *args], capture_output=True, text=True, timeout=120)


def _start(lake: Path, name: str, stderr: Path) -> subprocess.Popen:
    with open(stderr, "ab") as err:
        return zygote.popen(
            ["--lake", str(lake), "start", name],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=PATIENCE_S)

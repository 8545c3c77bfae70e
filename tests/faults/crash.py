"""Crash anywhere, for real: SIGKILL running ``reclock start`` jobs at random moments, then check.

Two pipelines run under fire at the same time, each in its own lake folder:

* ``streams`` reads a real Tansu broker: topic ``events`` (4 partitions, appended) and topic
  ``scores`` (3 partitions, keyed records with tombstones, an ``upsert`` output). A producer thread
  keeps producing for the whole campaign and records what the broker **acked** (topic, partition,
  offset, key, value): that, not what was sent, is the ground truth.
* ``drops`` reads a directory into which a thread keeps dropping CSV and JSON-lines files (written
  hidden, then renamed into place), recording every line and the byte offset it starts at.

Each job is a ``reclock start`` subprocess in its own process group. The harness kills the whole
group (driver, and with ``engine = "spark"`` its JVM and Python workers) with SIGKILL, either in
start-up (0.2-3 s after launch, before its first batch: Spark is still starting its JVM) or at a
random moment up to 2 s after the run's first batch, when batches, binding mints and Delta commits
follow each other back to back. Then it starts the job again. Most runs use the in-driver engine;
a few use Spark (the definition is re-created with ``--replace``). A watcher reads the consumer
group's committed offsets every ~100 ms.

At the end the feeds stop, one more run catches up and is stopped with ``reclock stop``, and
everything is checked with :mod:`tests.faults.reader`, which shares no code with the product:

* every acked ``events`` record is in its output exactly once, with its payload;
* the ``scores`` table equals a dictionary replay of the acked records (latest per key, a
  tombstone deletes), each row carrying the lineage of the record that won;
* every dropped file's every line is in ``drops`` exactly once, with its payload and offset;
* every row's ``_into_ts`` is what the durable bindings of the remap table say;
* the group's committed offsets never passed what every output held at that moment;
* ``reclock files`` lists every loaded file.

``python -m tests.faults.crash --kills 100`` runs the long campaign and prints its figures;
``tests/integration/test_crash_anywhere.py`` runs a short one in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import pyarrow.parquet as pq

from reclock.demo.broker import EmbeddedBroker
from tests.faults.reader import DeltaLog, Remap, checkpoint_agrees, label_of, read_rows
from tests.integration.helpers import reclock_cli
from tests.integration.kafka.conftest import Producer
from tests.integration.kafka.test_kafka_pipeline import _group_offsets, _start_job, _status
from tests.waiting import PATIENCE_S

__all__ = ["Campaign", "Report", "run_campaign"]

EVENTS, SCORES = "events", "scores"
PARTITIONS = {EVENTS: 4, SCORES: 3}
KEYS = 60
STREAMS, DROPS = "streams", "drops"
ERRORS = "_errors"


def partition_id(*parts: object) -> str:
    """A partition as output rows and remap rows spell it: a compact JSON list."""
    return json.dumps(list(parts), separators=(",", ":"))


@dataclass
class Campaign:
    """How hard to hit: kills per source, how many of them on Spark, and the feeds' pace."""

    kills: int = 6
    spark_kills: int = 2
    seed: int = 1
    burst: int = 6
    feed_pause: float = 0.1
    file_pause: float = 0.5
    stall_timeout: float = 120.0  # the final run gives up when it made no progress for this long


@dataclass
class Kill:
    source: str
    engine: str
    phase: str  # "start-up": before the run's first batch; "running": after it
    after_s: float


@dataclass
class Report:
    """The campaign's figures; :meth:`clean` says whether every promise held."""

    kills: list[Kill] = field(default_factory=list)
    produced: int = 0
    acked: int = 0
    files_dropped: int = 0
    lines_dropped: int = 0
    checked: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong_payload: list[str] = field(default_factory=list)
    wrong_into_ts: list[str] = field(default_factory=list)
    group_observations: int = 0
    group_commits_seen: int = 0
    group_violations: list[str] = field(default_factory=list)
    group_final: dict[str, int] = field(default_factory=dict)
    acked_ends: dict[str, int] = field(default_factory=dict)
    files_unlisted: list[str] = field(default_factory=list)
    checkpoints_checked: int = 0
    compacted_since: dict[str, int | None] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def clean(self) -> bool:
        """Exactly once, deterministic stamps, group never ahead, no job that died on its own."""
        return not (
            self.lost
            or self.duplicated
            or self.unexpected
            or self.wrong_payload
            or self.wrong_into_ts
            or self.group_violations
            or self.anomalies
        )

    def summary(self) -> str:
        by = Counter((k.source, k.engine, k.phase) for k in self.kills)
        kills = ", ".join(f"{s}/{e}/{p}: {n}" for (s, e, p), n in sorted(by.items()))
        lines = [
            f"kills                      {len(self.kills)} ({kills})",
            f"records produced / acked   {self.produced} / {self.acked} (+ {self.lines_dropped} lines "
            f"in {self.files_dropped} files)",
            f"records checked            {self.checked}",
            f"lost                       {len(self.lost)}",
            f"duplicated                 {len(self.duplicated)}",
            f"unexpected rows            {len(self.unexpected)}",
            f"wrong payload              {len(self.wrong_payload)}",
            f"wrong _into_ts             {len(self.wrong_into_ts)}",
            f"group-offset observations  {self.group_observations} ({self.group_commits_seen} with commits), "
            f"{len(self.group_violations)} ahead of the outputs",
            f"group final == acked ends  {self.group_final == self.acked_ends}",
            f"files missing from `reclock files`  {len(self.files_unlisted)} of {self.files_dropped}",
            f"checkpoints cross-checked  {self.checkpoints_checked}",
            f"remap compacted (since)    {self.compacted_since}",
            f"jobs that died on their own  {len(self.anomalies)}",
            f"elapsed                    {self.elapsed_s:.0f} s",
        ]
        for name in ("lost", "duplicated", "unexpected", "wrong_payload", "wrong_into_ts", "group_violations"):
            if getattr(self, name):
                lines.append(f"first {name}: {getattr(self, name)[:5]}")
        lines += [f"anomaly: {a}" for a in self.anomalies[:5]]
        return "\n".join(lines)


# -- feeds: the ground truth ----------------------------------------------------------------------


@dataclass(frozen=True)
class Acked:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes | None


class KafkaFeed(threading.Thread):
    """Produces ``events`` and keyed ``scores`` (20% tombstones) in bursts; keeps only acks.

    A key's partition is chosen here (key number modulo partitions), so each key lives in one
    partition and the partition's order is the order to replay it in.
    """

    def __init__(self, bootstrap: str, campaign: Campaign, rng: random.Random) -> None:
        super().__init__(daemon=True, name="kafka-feed")
        self.bootstrap, self.campaign, self.rng = bootstrap, campaign, rng
        self.stop = threading.Event()
        self.acked: list[Acked] = []
        self.produced = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        producer = Producer(self.bootstrap)
        n = 0
        try:
            while not self.stop.is_set():
                values = [json.dumps({"id": n + i, "body": f"e{n + i}"}).encode() for i in range(self.campaign.burst)]
                self.produced += len(values)
                for (t, p, o), v in zip(
                    producer.send(EVENTS, values, partition=lambda i, n=n: (n + i) % PARTITIONS[EVENTS]),
                    values,
                    strict=True,
                ):
                    self.acked.append(Acked(t, p, o, None, v))
                keys = [self.rng.randrange(KEYS) for _ in range(max(1, self.campaign.burst // 2))]
                scores = [
                    None if self.rng.random() < 0.2 else json.dumps({"score": n + i}).encode() for i in range(len(keys))
                ]
                self.produced += len(scores)
                delivered = producer.send(
                    SCORES,
                    scores,
                    keys=[f"user-{k}".encode() for k in keys],
                    partition=lambda i, keys=keys: keys[i] % PARTITIONS[SCORES],
                )
                for (t, p, o), k, v in zip(delivered, keys, scores, strict=True):
                    self.acked.append(Acked(t, p, o, f"user-{k}", v))
                n += self.campaign.burst
                time.sleep(self.campaign.feed_pause)
        except BaseException as exc:  # reported by the campaign
            self.failure = exc
        finally:
            producer.close()


class FileFeed(threading.Thread):
    """Drops CSV and JSON-lines files of 1-20 rows; remembers each line's offset and payload."""

    def __init__(self, folder: Path, campaign: Campaign, rng: random.Random) -> None:
        super().__init__(daemon=True, name="file-feed")
        self.folder, self.campaign, self.rng = folder, campaign, rng
        self.stop = threading.Event()
        self.files: dict[str, list[tuple[int, int, str]]] = {}  # name -> [(offset, id, name)]
        self.failure: BaseException | None = None

    def run(self) -> None:
        next_id = 0
        try:
            while not self.stop.is_set():
                number = len(self.files)
                csv = number % 2 == 0
                name = f"f-{number:06d}.{'csv' if csv else 'jsonl'}"
                text = "id,name\n" if csv else ""
                lines = []
                for _ in range(self.rng.randint(1, 20)):
                    label = f"n{next_id}"
                    lines.append((len(text.encode()), next_id, label))
                    text += f"{next_id},{label}\n" if csv else json.dumps({"id": next_id, "name": label}) + "\n"
                    next_id += 1
                hidden = self.folder / f".{name}.tmp"
                hidden.write_text(text)
                os.replace(hidden, self.folder / name)
                self.files[name] = lines
                time.sleep(self.campaign.file_pause)
        except BaseException as exc:
            self.failure = exc


# -- the consumer group, watched ------------------------------------------------------------------


class GroupWatch(threading.Thread):
    """Every ~100 ms: the group's committed offsets, then what the outputs hold, independently read.

    Committed offsets are read first; the tables only grow, so a violation seen this way is real.
    A committed offset ``c`` of a partition is allowed only if ``c <= R(L)[p]``, where ``L`` is the
    least label over the outputs (what *every* output holds), and, for the appended topic, only if
    every offset below ``c`` is a row of ``events`` or ``_errors``.
    """

    def __init__(self, bootstrap: str, group: str, lake: Path) -> None:
        super().__init__(daemon=True, name="group-watch")
        self.bootstrap, self.group = bootstrap, group
        outputs = lake / STREAMS / "outputs"
        self.logs = {o: DeltaLog(outputs / o) for o in (EVENTS, SCORES, ERRORS)}
        self.remap_log = DeltaLog(lake / STREAMS / "remap")
        self.stop = threading.Event()
        self.observations = 0
        self.commits_seen = 0
        self.admin_errors = 0
        self.violations: list[str] = []
        self.failure: BaseException | None = None
        self._cache: dict[tuple[str, tuple[str, ...] | None], list[dict]] = {}

    def run(self) -> None:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
        try:
            while not self.stop.wait(0.1):
                try:
                    committed = _group_offsets(admin, self.group)
                except KafkaError:  # the broker is busy: no observation this time
                    self.admin_errors += 1
                    continue
                for log in self.logs.values():
                    log.refresh()
                labels = [label_of(log, f"reclock/{STREAMS}/{o}") for o, log in self.logs.items()]
                try:
                    remap = Remap(self._rows(self.remap_log.refresh(), None))
                    held = self._held()
                except FileNotFoundError:  # vacuumed after the refresh: a newer snapshot has it
                    continue
                self.observations += 1
                self.commits_seen += bool(committed)
                bound = {} if None in labels else remap.frontier_at(min(labels))
                for (t, p), offset in committed.items():
                    pid = partition_id(t, p)
                    if offset > bound.get(pid, 0):
                        self.violations.append(f"{pid} committed {offset} > {bound.get(pid, 0)} held by every output")
                    if t == EVENTS:
                        below = sum(1 for o in held.get(pid, ()) if o < offset)
                        if below != offset:
                            self.violations.append(f"{pid} committed {offset}, only {below} offsets below it in rows")
        except BaseException as exc:
            self.failure = exc
        finally:
            admin.close()

    def _held(self) -> dict[str, set[int]]:
        """``_partition -> offsets`` in ``events`` and ``_errors``."""
        held: dict[str, set[int]] = {}
        for output in (EVENTS, ERRORS):
            for r in self._rows(self.logs[output], ("_partition", "_offset")):
                held.setdefault(r["_partition"], set()).add(r["_offset"])
        return held

    def _rows(self, log: DeltaLog, columns: tuple[str, ...] | None) -> list[dict]:
        """The rows of ``log``'s live files; parquet files never change, so each is read once."""
        rows = []
        for uri in log.uris():
            key = (uri, columns)
            if key not in self._cache:
                self._cache[key] = pq.read_table(uri, columns=list(columns) if columns else None).to_pylist()
            rows += self._cache[key]
        return rows


# -- the jobs under fire --------------------------------------------------------------------------


#: Maintenance every few batches and no history: kills land in compactions, optimizes and
#: vacuums too, and the checks then read tables whose old files are gone.
_MAINTENANCE = "[maintenance]\nevery = 4\nhistory_minutes = 0\n"


class Target:
    """One pipeline: its definition (per engine), its job runs, and whether it has caught up."""

    def __init__(self, name: str, workdir: Path, source: str, lag: Callable[[], int]) -> None:
        self.name, self.workdir, self.source, self.lag = name, workdir, source, lag
        self.lake = workdir / "lake"
        self.stderr = workdir / f"{name}.stderr"
        self.engine: str | None = None

    def define(self, engine: str) -> None:
        config = self.workdir / f"{self.name}.toml"
        spark = ""
        if engine == "spark":  # every batch on Spark: none in the driver while the session starts
            spark = '[spark]\nmaster = "local[1]"\nsmall_batch_offsets = 0\nbackground_start = false\n'
        config.write_text(
            f'[pipeline]\nname = "{self.name}"\nlake = "lake"\nengine = "{engine}"\nbatch_interval = 0.1\n'
            f"idle_interval = 1.0\nmax_batch = 200\nretry_backoff = 0.2\n{spark}{_MAINTENANCE}{self.source}"
        )
        args = ["create", str(config)] + (["--replace"] if self.engine is not None else [])
        done = reclock_cli(*args)
        if done.returncode != 0:
            raise RuntimeError(f"reclock create {self.name}: {done.stderr.strip()}")
        self.engine = engine

    def start(self) -> subprocess.Popen:
        return _start_job(self.lake, self.name, self.stderr)

    def status(self) -> dict:
        return _status(self.lake, self.name)


def _kill_loop(target: Target, campaign: Campaign, rng: random.Random, report: Report, lock: threading.Lock) -> None:
    """``campaign.kills`` runs of ``target``, each SIGKILLed; Spark for a few spread over them."""
    spark_at = {(k + 1) * campaign.kills // (campaign.spark_kills + 1): k for k in range(campaign.spark_kills)}
    for i in range(campaign.kills):
        engine = "spark" if i in spark_at else "local"
        if engine != target.engine:
            target.define(engine)
        # Spark runs alternate start-up and running kills; a third of the local ones hit start-up.
        start_up = spark_at[i] % 2 == 0 if i in spark_at else i % 3 == 1
        job = target.start()
        launched = time.monotonic()
        if start_up:
            _sleep_while_alive(job, rng.uniform(1.0 if engine == "spark" else 0.2, 3.0))
        else:
            deadline = launched + (180 if engine == "spark" else 60)
            while job.poll() is None and time.monotonic() < deadline and not _going(target, job):
                time.sleep(0.05)
            _sleep_while_alive(job, rng.uniform(0.0, 2.0))
        after = time.monotonic() - launched
        phase = "running" if _going(target, job) else "start-up"
        if job.poll() is not None:
            with lock:
                report.anomalies.append(
                    f"{target.name} run {i} ({engine}) exited with {job.returncode} before its kill: "
                    f"{target.stderr.read_text()[-1500:]}"
                )
            return
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
        with lock:
            report.kills.append(Kill(target.name, engine, phase, round(after, 2)))


def _going(target: Target, job: subprocess.Popen) -> bool:
    status = target.status()
    return status.get("pid") == job.pid and status.get("batches", 0) >= 1


def _sleep_while_alive(job: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def _finish(target: Target, campaign: Campaign, report: Report, lock: threading.Lock) -> None:
    """:func:`_finish_run`, whose failure (a job that does not exit after its stop) is an anomaly
    of the report: it runs on a thread of its own, where an exception would only be a warning."""
    try:
        _finish_run(target, campaign, report, lock)
    except Exception as exc:
        with lock:
            report.anomalies.append(f"{target.name} final run failed: {exc!r}: {target.stderr.read_text()[-1500:]}")


def _finish_run(target: Target, campaign: Campaign, report: Report, lock: threading.Lock) -> None:
    """One last run on the in-driver engine: catch up, then a clean ``reclock stop``."""
    if target.engine != "local":
        target.define("local")
    job = target.start()
    try:
        deadline = time.monotonic() + campaign.stall_timeout
        least = target.lag()
        while least > 0 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
            lag = target.lag()
            if lag < least:
                least, deadline = lag, time.monotonic() + campaign.stall_timeout
        if least > 0:
            with lock:
                report.anomalies.append(f"{target.name} final run did not catch up: {least} offsets or files behind")
        stopped = reclock_cli("--lake", str(target.lake), "stop", target.name, "--wait", "60")
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=60)
    if stopped.returncode != 0 or code != 0:
        with lock:
            report.anomalies.append(
                f"{target.name} final run: stop exited {stopped.returncode}, job {code}: "
                f"{target.stderr.read_text()[-1500:]}"
            )


# -- verification ---------------------------------------------------------------------------------


def _durable_frontier(lake: Path, name: str, outputs: list[str]) -> tuple[dict[str, int], bool]:
    """``R(least label over the outputs)`` and whether it is closed, read independently."""
    labels = []
    for output in outputs:
        labels.append(label_of(DeltaLog(lake / name / "outputs" / output).refresh(), f"reclock/{name}/{output}"))
    if None in labels:
        return {}, False
    remap = Remap.read(lake / name / "remap")
    return remap.frontier_at(min(labels)), remap.is_closed_at(min(labels))


def _ends(acked: list[Acked]) -> dict[str, int]:
    ends: dict[str, int] = {}
    for a in acked:
        pid = partition_id(a.topic, a.partition)
        ends[pid] = max(ends.get(pid, 0), a.offset + 1)
    return ends


def _table(lake: Path, name: str, output: str) -> list[dict]:
    rows = read_rows(DeltaLog(lake / name / "outputs" / output).refresh())
    return rows.to_pylist() if rows is not None else []


def _check_stamps(report: Report, remap: Remap, output: str, rows: list[dict]) -> None:
    for r in rows:
        if not remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"]):
            want = remap.stamp(r["_partition"], r["_offset"])
            report.wrong_into_ts.append(f"{output} {r['_partition']}@{r['_offset']}: {r['_into_ts']} != {want}")


def _check_appended(report: Report, output: str, rows: list[dict], expected: dict[tuple[str, int], dict]) -> None:
    """Each expected ``(partition, offset)`` exactly once, with its payload, and nothing else."""
    seen = Counter((r["_partition"], r["_offset"]) for r in rows)
    report.duplicated += [f"{output} {p}@{o} x{n}" for (p, o), n in seen.items() if n > 1]
    report.lost += [f"{output} {p}@{o}" for (p, o) in expected if (p, o) not in seen]
    report.unexpected += [f"{output} {p}@{o}" for (p, o) in seen if (p, o) not in expected]
    for r in rows:
        want = expected.get((r["_partition"], r["_offset"]))
        if want is not None and any(r[k] != v for k, v in want.items()):
            report.wrong_payload.append(f"{output} {r['_partition']}@{r['_offset']}: {r} != {want}")
    report.checked += len(expected)


def _verify_streams(lake: Path, feed: KafkaFeed, report: Report) -> None:
    remap = Remap.read(lake / STREAMS / "remap")
    report.compacted_since[STREAMS] = remap.since
    events = _table(lake, STREAMS, EVENTS)
    expected = {}
    for a in feed.acked:
        if a.topic == EVENTS:
            value = json.loads(a.value)
            expected[(partition_id(a.topic, a.partition), a.offset)] = {"id": value["id"], "body": value["body"]}
    _check_appended(report, EVENTS, events, expected)
    _check_stamps(report, remap, EVENTS, events)

    replay: dict[str, tuple[int, str, int]] = {}  # key -> (score, partition, offset)
    for a in sorted((a for a in feed.acked if a.topic == SCORES), key=lambda a: (a.partition, a.offset)):
        if a.value is None:
            replay.pop(a.key, None)
        else:
            replay[a.key] = (json.loads(a.value)["score"], partition_id(a.topic, a.partition), a.offset)
    scores = _table(lake, STREAMS, SCORES)
    seen = Counter(r["user"] for r in scores)
    report.duplicated += [f"{SCORES} key {k} x{n}" for k, n in seen.items() if n > 1]
    report.lost += [f"{SCORES} key {k}" for k in replay if k not in seen]
    report.unexpected += [f"{SCORES} key {k} (deleted or never acked)" for k in seen if k not in replay]
    for r in scores:
        want = replay.get(r["user"])
        if want is not None and (r["score"], r["_partition"], r["_offset"]) != want:
            report.wrong_payload.append(f"{SCORES} key {r['user']}: {r} != {want}")
    report.checked += len(replay)
    _check_stamps(report, remap, SCORES, scores)

    errors = _table(lake, STREAMS, ERRORS)
    report.unexpected += [f"{ERRORS} {r['_partition']}@{r['_offset']}: {r['message']}" for r in errors]


def _verify_drops(lake: Path, feed: FileFeed, report: Report) -> None:
    remap = Remap.read(lake / DROPS / "remap")
    report.compacted_since[DROPS] = remap.since
    rows = _table(lake, DROPS, "rows")
    expected = {
        (partition_id(name, 0), offset): {"id": i, "name": label}
        for name, lines in feed.files.items()
        for offset, i, label in lines
    }
    _check_appended(report, "rows", rows, expected)
    _check_stamps(report, remap, "rows", rows)
    errors = _table(lake, DROPS, ERRORS)
    report.unexpected += [f"{DROPS} {ERRORS} {r['_partition']}@{r['_offset']}: {r['message']}" for r in errors]
    listed = reclock_cli("--lake", str(lake), "files", DROPS, "--json", "--limit", "0")
    loaded = (
        {r["path"] for r in json.loads(listed.stdout) if r["state"] == "Loaded"} if listed.returncode == 0 else set()
    )
    report.files_unlisted = sorted(set(feed.files) - loaded)


def _cross_check_checkpoints(lake: Path, report: Report) -> None:
    for log in lake.glob("*/*/*/_delta_log"):
        agrees = checkpoint_agrees(log.parent)
        if agrees is None:
            continue
        report.checkpoints_checked += 1
        if not agrees:
            report.anomalies.append(f"{log.parent}: checkpoint and full replay disagree on the live files")
    for log in lake.glob("*/remap/_delta_log"):
        agrees = checkpoint_agrees(log.parent)
        if agrees is not None:
            report.checkpoints_checked += 1
            if not agrees:
                report.anomalies.append(f"{log.parent}: checkpoint and full replay disagree on the live files")


# -- the campaign ---------------------------------------------------------------------------------


def run_campaign(workdir: Path, campaign: Campaign, out: TextIO | None = None) -> Report:
    """Run both pipelines under fire, let them catch up, and check everything; see the module doc."""
    started = time.monotonic()
    rng = random.Random(campaign.seed)
    report = Report()
    lock = threading.Lock()
    say = (lambda text: print(text, file=out, flush=True)) if out is not None else (lambda text: None)
    workdir.mkdir(parents=True, exist_ok=True)
    incoming = workdir / "incoming"
    incoming.mkdir(exist_ok=True)
    with EmbeddedBroker(log_dir=workdir / "broker") as broker:
        _create_topics(broker.bootstrap)
        kafka_feed = KafkaFeed(broker.bootstrap, campaign, random.Random(rng.random()))
        file_feed = FileFeed(incoming, campaign, random.Random(rng.random()))
        watch = GroupWatch(broker.bootstrap, f"reclock-{STREAMS}", workdir / "lake")
        lake = workdir / "lake"
        streams = Target(
            STREAMS,
            workdir,
            _kafka_source(broker.bootstrap),
            lambda: _lag(lake, STREAMS, [EVENTS, SCORES, ERRORS], _ends(kafka_feed.acked)),
        )
        drops = Target(
            DROPS,
            workdir,
            _files_source(incoming),  # a file is bound whole: covered once its upper is past 0
            lambda: _lag(lake, DROPS, ["rows", ERRORS], {partition_id(n, 0): 1 for n in file_feed.files}),
        )
        for target in (streams, drops):
            target.define("local")
        threads = [kafka_feed, file_feed, watch]
        for thread in threads:
            thread.start()
        try:
            loops = [
                threading.Thread(
                    target=_kill_loop, args=(t, campaign, random.Random(rng.random()), report, lock), name=t.name
                )
                for t in (streams, drops)
            ]
            for loop in loops:
                loop.start()
            for loop in loops:
                loop.join()
            say(f"{len(report.kills)} kills done after {time.monotonic() - started:.0f} s; catching up")
            kafka_feed.stop.set()
            file_feed.stop.set()
            kafka_feed.join(timeout=60)
            file_feed.join(timeout=60)
            finals = [
                threading.Thread(target=_finish, args=(t, campaign, report, lock), name=f"{t.name}-final")
                for t in (streams, drops)
            ]
            for final in finals:
                final.start()
            for final in finals:
                final.join()
            time.sleep(0.5)  # a few more group observations of the final state
        finally:
            for thread in threads:
                thread.stop.set()  # type: ignore[attr-defined]
            watch.join(timeout=PATIENCE_S)
        for thread in threads:
            if thread.failure is not None:  # type: ignore[attr-defined]
                report.anomalies.append(f"{thread.name} failed: {thread.failure!r}")  # type: ignore[attr-defined]
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=5000)
        report.group_final = {
            partition_id(t, p): o for (t, p), o in _group_offsets(admin, f"reclock-{STREAMS}").items()
        }
        admin.close()
    report.produced = kafka_feed.produced
    report.acked = len(kafka_feed.acked)
    report.acked_ends = _ends(kafka_feed.acked)
    report.files_dropped = len(file_feed.files)
    report.lines_dropped = sum(len(lines) for lines in file_feed.files.values())
    report.group_observations = watch.observations
    report.group_commits_seen = watch.commits_seen
    report.group_violations = watch.violations
    _verify_streams(lake, kafka_feed, report)
    _verify_drops(lake, file_feed, report)
    _cross_check_checkpoints(lake, report)
    report.elapsed_s = time.monotonic() - started
    return report


def _lag(lake: Path, name: str, outputs: list[str], ends: dict[str, int]) -> int:
    """Offsets below ``ends`` that not every output holds yet, by the independent reader."""
    try:
        frontier, closed = _durable_frontier(lake, name, outputs)
    except (FileNotFoundError, OSError):  # a table appearing right now
        return sum(ends.values())
    return 0 if closed else sum(max(0, end - frontier.get(p, 0)) for p, end in ends.items())


def _create_topics(bootstrap: str) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        admin.create_topics([NewTopic(t, n, 1) for t, n in PARTITIONS.items()])
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            described = admin.describe_topics(list(PARTITIONS))
            if all(len(d.get("partitions", [])) == PARTITIONS[d["name"]] for d in described):
                return
            time.sleep(0.05)
        raise RuntimeError("the topics did not appear")
    finally:
        admin.close()


def _kafka_source(bootstrap: str) -> str:
    return f"""
[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{EVENTS}", "{SCORES}"]
format = "json"
read_timeout_s = 5.0

[source.outputs.{EVENTS}]
topics = ["{EVENTS}"]
schema = {{ id = "int64", body = "string" }}

[source.outputs.{SCORES}]
topics = ["{SCORES}"]
schema = {{ score = "int64" }}
metadata = {{ key = "user" }}
key_format = "text"
key = ["user"]
envelope = "upsert"
"""


def _files_source(folder: Path) -> str:
    return f"""
[source]
kind = "files"
path = {json.dumps(str(folder))}
columns = {{ id = "int64", name = "string" }}
max_files_per_batch = 5
"""


def parser() -> argparse.ArgumentParser:
    """The command line of the long mode (docs/reliability.md quotes it; a unit test parses it)."""
    cli = argparse.ArgumentParser(prog="python -m tests.faults.crash", description=__doc__.split("\n\n")[0])
    cli.add_argument("--kills", type=int, default=100, help="SIGKILLs per source (default 100)")
    cli.add_argument("--spark-kills", type=int, default=4, help="of which on the Spark engine (default 4)")
    cli.add_argument("--seed", type=int, default=1)
    cli.add_argument("--workdir", type=Path, help="keep the lake, logs and inputs here (default: a temp dir)")
    return cli


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="reclock-crash-"))
    campaign = Campaign(kills=args.kills, spark_kills=args.spark_kills, seed=args.seed)
    report = run_campaign(workdir, campaign, out=sys.stdout)
    print(report.summary())
    if report.clean() and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"lake, inputs and job logs kept in {workdir}")
    return 0 if report.clean() else 1


if __name__ == "__main__":
    sys.exit(main())

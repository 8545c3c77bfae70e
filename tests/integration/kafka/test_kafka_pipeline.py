"""Kafka end to end: real broker (embedded Tansu), real pipelines and jobs, real Delta tables.

Every check reads the lake independently (``reclock.persist.read.read_table`` on each output's Delta
table, the remap table through ``RemapTable``) and compares it with what the broker itself said
when it accepted each record (the producer's delivery coordinates). Kafka is unbounded, so each
run steps until every output holds what was produced, within a deadline.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from reclock.demo.broker import EmbeddedBroker
from reclock.job import lifecycle
from reclock.job.config import load_config
from reclock.persist.asof import read_as_of
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.remap import RemapTable
from reclock.persist.status_tables import STATUS_SCHEMAS, read_status_table
from reclock.runtime.health import Health
from reclock.runtime.pipeline import BatchFailed, Pipeline
from reclock.runtime.planes import LocalDataPlane, SparkDataPlane
from reclock.runtime.settings import Settings
from reclock.sources.base import ERRORS
from reclock.sources.kafka import KafkaSource, output_name_for
from reclock.timeline.frontier import Frontier, decode_partition, encode_partition
from tests import zygote
from tests.cli import reclock_in_process
from tests.integration.helpers import write_config
from tests.integration.kafka.conftest import Producer
from tests.waiting import PATIENCE_S

SCHEMA = {"id": "int64", "topic": "string"}

Delivered = list[tuple[str, int, int]]  # (topic, partition, offset) as the broker acknowledged them


# -- helpers --------------------------------------------------------------------------------------


def _value(topic: str, i: int) -> bytes:
    return json.dumps({"id": i, "topic": topic}).encode()


def _produce(produce: Producer, topic: str, ids: Iterable[int], partitions: int) -> dict[tuple[str, int, int], int]:
    """Send JSON records ``{"id": i}`` round-robin over ``partitions``; ``{(topic, p, offset): id}``."""
    ids = list(ids)
    delivered = produce.send(topic, [_value(topic, i) for i in ids], partition=lambda k: ids[k] % partitions)
    return dict(zip(delivered, ids, strict=True))


def _ends(coordinates: Iterable[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
    ends: dict[tuple[str, int], int] = {}
    for t, p, o in coordinates:
        ends[(t, p)] = max(ends.get((t, p), 0), o + 1)
    return ends


def _kafka_source(broker: EmbeddedBroker, **kwargs) -> KafkaSource:
    kwargs.setdefault("format", "json")
    kwargs.setdefault("schema", SCHEMA)
    kwargs.setdefault("read_timeout_s", 5.0)
    return KafkaSource(broker.bootstrap, **kwargs)


def _step_until_in(pipeline: Pipeline, ends: dict[tuple[str, int], int], timeout: float = 60.0) -> int:
    """Step until every output holds every offset below ``ends``; the number of steps taken."""
    deadline = time.monotonic() + timeout
    steps = 0
    while not all(pipeline.resume_frontier().covers(p, end - 1) for p, end in ends.items()):
        assert time.monotonic() < deadline, f"not in after {timeout}s: {pipeline.resume_frontier()!r} vs {ends}"
        if pipeline.step().idle:
            time.sleep(0.05)
        steps += 1
    return steps


def _rows(lake: Path, pipeline: str, output: str, columns: list[str] | None = None) -> list[dict]:
    """An output's rows, read straight from its Delta table (empty before its first commit)."""
    path = Lake.at(lake).output_path(pipeline, output)
    if not (path / "_delta_log").is_dir():
        return []
    return read_table(DeltaTable(str(path)), columns=columns).to_pylist()


def _assert_exactly_once(lake: Path, pipeline: str, expected: dict[str, dict[tuple[str, int, int], int]]) -> None:
    """Each output holds exactly its records, once each, with the produced payload, stamped as the
    durable bindings dictate; ``_errors`` is empty."""
    bindings = RemapTable(Lake.at(lake).remap_path(pipeline)).bindings
    for output, produced in expected.items():
        rows = _rows(lake, pipeline, output)
        lineage = Counter((r["_partition"], r["_offset"]) for r in rows)
        duplicated = [k for k, n in lineage.items() if n > 1]
        assert not duplicated, f"{output}: duplicated {duplicated[:5]}"
        want = {(encode_partition((t, p)), o): i for (t, p, o), i in produced.items()}
        assert set(lineage) == set(want), (
            f"{output}: missing {sorted(set(want) - set(lineage))[:5]}, "
            f"unexpected {sorted(set(lineage) - set(want))[:5]}"
        )
        assert all(r["id"] == want[(r["_partition"], r["_offset"])] for r in rows), f"{output}: payload mismatch"
        wrong = [r for r in rows if bindings.reclock(decode_partition(r["_partition"]), r["_offset"]) != r["_into_ts"]]
        assert not wrong, f"{output}: rows stamped against the bindings' rule: {wrong[:3]}"
    assert _rows(lake, pipeline, ERRORS) == []


def _group_offsets(admin, group: str) -> dict[tuple[str, int], int]:
    committed = admin.list_group_offsets(group).get(group, {})
    return {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items() if meta.offset >= 0}


# -- 1. many partitions, two topics, an output each ----------------------------------------------


def _two_topics_exactly_once(broker, topic, produce, admin, lake: Path, data_plane, n: tuple[int, int]) -> None:
    names = [topic(partitions=4), topic(partitions=4)]
    group = f"g-{names[0]}"
    source = _kafka_source(broker, topics=names, group_id=group, max_split_offsets=64)
    pipeline = Pipeline("two", lake, source, data_plane=data_plane, settings=Settings(max_batch=300))
    produced: dict[str, dict[tuple[str, int, int], int]] = {output_name_for(t): {} for t in names}
    for round_ in range(2):  # Kafka is unbounded: more records arrive after the first ones landed
        for name, count in zip(names, n, strict=True):
            half = range(round_ * count // 2, (round_ + 1) * count // 2)
            produced[output_name_for(name)].update(_produce(produce, name, half, partitions=4))
        steps = _step_until_in(pipeline, _ends(k for p in produced.values() for k in p))
        assert steps >= 2  # max_batch caps each binding: several batches
    assert {o: len(p) for o, p in produced.items()} == {output_name_for(t): c for t, c in zip(names, n, strict=True)}
    _assert_exactly_once(lake, "two", produced)
    # The consumer group holds the resume frontier: everything, and not one offset beyond.
    assert _group_offsets(admin, group) == _ends(k for p in produced.values() for k in p)
    source.close()


def test_each_topic_lands_exactly_once_in_its_own_output_across_partitions(broker, topic, produce, admin, tmp_path):
    _two_topics_exactly_once(broker, topic, produce, admin, tmp_path, LocalDataPlane(), (700, 500))


@pytest.mark.spark
def test_spark_data_plane_lands_each_topic_exactly_once(spark, broker, topic, produce, admin, tmp_path):
    """Splits run as Spark tasks: the source (no live clients) and its splits cross to Python workers."""
    _two_topics_exactly_once(broker, topic, produce, admin, tmp_path, SparkDataPlane(spark), (600, 400))


# -- 2. a real job, SIGKILLed mid-run while a producer keeps producing ----------------------------


class _GroupWatch(threading.Thread):
    """Every 100 ms: the consumer group's committed offsets, then what the output tables hold.

    Committed offsets are read *first*: the tables only grow, so a violation seen this way is real.
    ``committed`` offset ``c`` of a partition is allowed only if every offset below ``c`` is
    durable in some output (the data output or ``_errors``): invariant 4, computed from the tables.
    """

    def __init__(self, bootstrap: str, group: str, lake: Path, pipeline: str, outputs: list[str]) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.group, self.lake, self.pipeline, self.outputs = bootstrap, group, lake, pipeline, outputs
        self.stop = threading.Event()
        self.observations = 0
        self.commits_seen = 0
        self.violations: list[str] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
        try:
            while not self.stop.wait(0.1):
                committed = _group_offsets(admin, self.group)
                durable: dict[str, set[int]] = {}
                try:
                    for output in self.outputs:
                        for r in _rows(self.lake, self.pipeline, output, ["_partition", "_offset"]):
                            durable.setdefault(r["_partition"], set()).add(r["_offset"])
                except Exception:  # a table being created right now: no verdict this time
                    continue
                self.observations += 1
                self.commits_seen += bool(committed)
                for (t, p), offset in committed.items():
                    held = durable.get(encode_partition((t, p)), set())
                    below = sum(1 for o in held if o < offset)
                    if below != offset:
                        self.violations.append(f"{t}[{p}] committed {offset} but only {below} offsets below it durable")
        except BaseException as exc:  # reported by the test
            self.failure = exc
        finally:
            admin.close()


class _Feeder(threading.Thread):
    """Produces JSON records in small bursts until stopped; remembers every delivery."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, burst: int = 150, pause: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(bootstrap)
        self.topic, self.partitions, self.burst, self.pause = topic, partitions, burst, pause
        self.stop = threading.Event()
        self.produced: dict[tuple[str, int, int], int] = {}
        self.failure: BaseException | None = None

    def run(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                self.produced.update(_produce(self.producer, self.topic, range(i, i + self.burst), self.partitions))
                i += self.burst
                time.sleep(self.pause)
        except BaseException as exc:
            self.failure = exc
        finally:
            self.producer.close()


def _start_job(lake: Path, name: str, stderr: Path) -> subprocess.Popen:
    with open(stderr, "ab") as err:  # the child keeps its own copy of the descriptor
        return zygote.popen(
            ["--lake", str(lake), "start", name],
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _status(lake: Path, name: str) -> dict:
    path = Lake.at(lake).status_path(name)
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


@pytest.mark.usefixtures("reclock_processes")
def test_sigkill_mid_run_then_restart_lands_every_record_once_and_commits_only_what_is_durable(broker, topic, tmp_path):
    name, lake = "killed", tmp_path / "lake"
    t = topic(partitions=4)
    output = output_name_for(t)
    config = write_config(
        tmp_path / "p.toml",
        pipeline={"name": name, "lake": "lake", "engine": "local", "max_batch": 600, "batch_interval": 0.1},
        source={
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap,
            "topics": [t],
            "format": "json",
            "schema": SCHEMA,
            "read_timeout_s": 5.0,
        },
    )
    assert reclock_in_process("create", str(config)).returncode == 0
    feeder = _Feeder(broker.bootstrap, t, partitions=4)
    watch = _GroupWatch(broker.bootstrap, f"reclock-{name}", lake, name, [output, ERRORS])
    feeder.start()
    watch.start()
    stderr = tmp_path / "job.stderr"
    jobs: list[subprocess.Popen] = []
    try:
        first = _start_job(lake, name, stderr)
        jobs.append(first)
        _wait_for(lambda: _status(lake, name).get("batches", 0) >= 4, 60, "four batches of the first job")
        os.killpg(first.pid, signal.SIGKILL)  # mid-run: the producer keeps going
        first.wait(timeout=PATIENCE_S)
        assert first.returncode == -signal.SIGKILL
        killed_at = dict(feeder.produced)
        time.sleep(0.5)
        second = _start_job(lake, name, stderr)
        jobs.append(second)
        # The watch must see the restarted job commit while records still flow: a fast restart must
        # not end the run before the invariant was checked often enough to mean something.
        _wait_for(
            lambda: (
                watch.failure is not None
                or (
                    len(feeder.produced) > len(killed_at) + 600 and watch.observations >= 20 and watch.commits_seen >= 5
                )
            ),
            90,
            "records produced after the kill, and twenty observations of the group",
        )
        feeder.stop.set()
        feeder.join(timeout=PATIENCE_S)
        assert feeder.failure is None
        ends = _ends(feeder.produced)

        def all_in() -> bool:
            resume = Frontier.from_json(_status(lake, name).get("resume_frontier", "{}"))
            return all(resume.covers(p, end - 1) for p, end in ends.items())

        _wait_for(all_in, 60, "the restarted job to catch up")
        time.sleep(0.3)  # a few more observations of the final state
        assert reclock_in_process("--lake", str(lake), "stop", name, "--wait", f"{PATIENCE_S:.0f}").returncode == 0
        assert second.wait(timeout=60) == 0, stderr.read_text()[-3000:]
    finally:
        feeder.stop.set()
        watch.stop.set()
        watch.join(timeout=PATIENCE_S)
        for started in jobs:
            if started.poll() is None:
                os.killpg(started.pid, signal.SIGKILL)
    assert watch.failure is None, watch.failure
    assert watch.observations >= 20 and watch.commits_seen >= 5, (watch.observations, watch.commits_seen)
    assert not watch.violations, watch.violations[:5]
    _assert_exactly_once(lake, name, {output: feeder.produced})
    # The group ends at the final resume frontier: every produced record.
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    assert _group_offsets(admin, f"reclock-{name}") == ends
    admin.close()


# -- 3. malformed records -------------------------------------------------------------------------

_BAD = [b"{not json", b"[1, 2]", b'{"id": "seven"}', b"", b'"just a string"', b'{"id": 1} trailing', b"\xff\xfe"]


def test_malformed_records_land_in_errors_with_coordinates_and_good_ones_in_the_output(
    broker, topic, produce, tmp_path
):
    t = topic(partitions=2)
    values, bad_at = [], set()
    for i in range(56):
        if i % 8 == 3:
            bad_at.add(i)
            values.append(_BAD[len(bad_at) % len(_BAD)])
        else:
            values.append(_value(t, i))
    delivered = produce.send(t, values, partition=lambda i: i % 2)
    source = _kafka_source(broker, topics=[t], on_record_error="skip")
    pipeline = Pipeline("bad", tmp_path, source, data_plane=LocalDataPlane(), settings=Settings(max_batch=25))
    _step_until_in(pipeline, _ends(delivered))

    good = {c: i for i, c in enumerate(delivered) if i not in bad_at}
    bad = {(encode_partition((tt, p)), o): values[i] for i, (tt, p, o) in enumerate(delivered) if i in bad_at}
    rows = _rows(tmp_path, "bad", output_name_for(t))
    assert sorted((r["_partition"], r["_offset"], r["id"]) for r in rows) == sorted(
        (encode_partition((tt, p)), o, i) for (tt, p, o), i in good.items()
    )
    errors = _rows(tmp_path, "bad", ERRORS)
    assert len(errors) == len(bad_at) == 7
    for e in errors:
        assert decode_partition(e["_partition"]) in {(t, 0), (t, 1)}  # the encoded ["topic",p]
        assert e["raw"] == bad[(e["_partition"], e["_offset"])] and e["kind"] == "decode" and e["message"]
    # Nothing lost, nothing twice: every delivered coordinate is in exactly one of the two tables.
    landed = Counter(
        [(r["_partition"], r["_offset"]) for r in rows] + [(e["_partition"], e["_offset"]) for e in errors]
    )
    assert landed == Counter((encode_partition((tt, p)), o) for tt, p, o in delivered)
    bindings = RemapTable(Lake.at(tmp_path).remap_path("bad")).bindings
    for r in rows + errors:  # bad records are stamped like the good ones of their batch
        assert r["_into_ts"] == bindings.reclock(decode_partition(r["_partition"]), r["_offset"])


def test_malformed_record_with_fail_policy_fails_the_pipeline_and_nothing_of_its_batch_is_visible(
    broker, topic, produce, admin, tmp_path
):
    t = topic(partitions=2)
    produce.send(t, [_value(t, i) for i in range(10)], partition=0)  # all good
    produce.send(t, [_value(t, 10), b"{oops", _value(t, 12)], partition=1)  # offset 1 is bad
    group = f"g-{t}"
    source = _kafka_source(broker, topics=[t], on_record_error="fail", group_id=group)
    settings = Settings(max_retries=2, retry_backoff=0.01, max_backoff=0.05, stop_on_error=True)
    pipeline = Pipeline("strict", tmp_path, source, data_plane=LocalDataPlane(), settings=settings)
    health: list[Health] = []
    with pytest.raises(BatchFailed) as info:
        pipeline.run(threading.Event(), on_health=lambda p: health.append(p.health))
    assert pipeline.health is Health.FAILED and health[-1] is Health.FAILED
    assert health.count(Health.STALLED) == 2  # the retries, then the failure
    assert f"{t}[1]@1" in str(info.value) and "on_record_error='fail'" in pipeline.last_error
    # The batch bound partition 0's good records too; none of them, and no error row, is visible.
    batch = info.value.report.binding_ts
    assert pipeline.remap.bindings.upper == batch + 1  # the binding is durable ...
    for output in (output_name_for(t), ERRORS):
        assert _rows(tmp_path, "strict", output) == []  # ... but no output holds it
        assert pipeline.sinks[output].upper <= batch
    assert _group_offsets(admin, group) == {}  # and nothing was committed upstream


# -- 4. discovery ---------------------------------------------------------------------------------


def test_topic_created_while_running_joins_with_all_its_records_at_one_into_time(broker, topic, produce, tmp_path):
    prefix = f"grow{time.monotonic_ns() % 10**8}"
    first = topic(name=f"{prefix}-a", partitions=2)
    produced = _produce(produce, first, range(20), partitions=2)
    source = _kafka_source(broker, pattern=rf"{prefix}-.*")
    (output,) = [o.name for o in source.outputs()]
    pipeline = Pipeline("grow", tmp_path, source, data_plane=LocalDataPlane())
    _step_until_in(pipeline, _ends(produced))
    pipeline.step()  # running, idle

    second = topic(name=f"{prefix}-b", partitions=3)
    topic(name=f"x{prefix}-c")  # does not match the pattern
    late = _produce(produce, second, range(100, 145), partitions=3)
    produced.update(late)
    _step_until_in(pipeline, _ends(produced))

    _assert_exactly_once(tmp_path, "grow", {output: produced})
    rows = _rows(tmp_path, "grow", output)
    stamps = {t: {r["_into_ts"] for r in rows if decode_partition(r["_partition"])[0] == t} for t in (first, second)}
    (joined_at,) = stamps[second]  # every record the new topic already held: one into time
    assert joined_at > max(stamps[first])
    assert {decode_partition(r["_partition"]) for r in rows} == {(first, 0), (first, 1)} | {
        (second, p) for p in range(3)
    }


# -- 5. a broker that stops answering -------------------------------------------------------------


@pytest.mark.kafka  # a broker of its own, paused
def test_paused_broker_stalls_the_pipeline_then_it_recovers_and_loses_and_duplicates_nothing(tmp_path):
    with EmbeddedBroker() as own:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=own.bootstrap)
        admin.create_topics([NewTopic("paused", 2, 1)])
        admin.close()
        producer = Producer(own.bootstrap)
        produced = _produce(producer, "paused", range(200), partitions=2)
        source = KafkaSource(
            own.bootstrap, topics=["paused"], format="json", schema=SCHEMA, group_id="g", read_timeout_s=1.0
        )
        settings = Settings(batch_interval=0.05, idle_interval=0.5, retry_backoff=0.1, max_backoff=0.5)
        pipeline = Pipeline("paused", tmp_path, source, data_plane=LocalDataPlane(), settings=settings)
        history: list[tuple[float, Health]] = []
        stop = threading.Event()
        runner = threading.Thread(
            target=pipeline.run,
            args=(stop,),
            kwargs={"on_health": lambda p: history.append((time.monotonic(), p.health))},
        )
        runner.start()
        try:
            resume = pipeline.resume_frontier
            _wait_for(
                lambda: all(resume().covers(p, e - 1) for p, e in _ends(produced).items()),
                PATIENCE_S,
                "the first records",
            )
            produced.update(_produce(producer, "paused", range(200, 400), partitions=2))  # in flight when paused
            own.pause()
            paused_at = time.monotonic()
            try:
                _wait_for(lambda: any(h is Health.STALLED for t, h in history if t > paused_at), PATIENCE_S, "stalled")
                time.sleep(max(0.0, 10 - (time.monotonic() - paused_at)))
                assert pipeline.health is Health.STALLED and "Timeout" in (pipeline.last_error or "")
            finally:
                own.resume()
            resumed_at = time.monotonic()
            produced.update(_produce(producer, "paused", range(400, 600), partitions=2))
            ends = _ends(produced)
            _wait_for(lambda: all(resume().covers(p, e - 1) for p, e in ends.items()), 60, "recovery")
            assert runner.is_alive()
        finally:
            stop.set()
            runner.join(timeout=60)
            producer.close()
            source.close()
        recovered = [t for t, h in history if h is Health.RUNNING and t > resumed_at]
        assert recovered, "health never went back to running"
        assert recovered[0] - resumed_at < 20
        assert pipeline.health is Health.STOPPED
        _assert_exactly_once(tmp_path, "paused", {"paused": produced})


# -- 6. secrets -----------------------------------------------------------------------------------

SECRET = "hunter2-SASL-secret-4242"


def _secret_config(tmp_path: Path, broker: EmbeddedBroker, name: str, t: str, protocol: str) -> Path:
    """Tansu has no SASL: with PLAINTEXT kafka-python accepts the sasl_* settings and ignores them,
    so the pipeline really runs; with SASL_PLAINTEXT it attempts the handshake, which Tansu refuses."""
    return write_config(
        tmp_path / f"{name}.toml",
        pipeline={"name": name, "lake": "lake", "engine": "local", "batch_interval": 0.1, "retry_backoff": 0.2},
        source={
            "kind": "kafka",
            "bootstrap_servers": broker.bootstrap,
            "topics": [t],
            "format": "json",
            "schema": SCHEMA,
            "read_timeout_s": 2.0,
            "client_settings": {
                "security_protocol": protocol,
                "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "reclock",
                "sasl_plain_password": "${RECLOCK_TEST_KAFKA_PASSWORD}",
            },
        },
    )


def _everything_the_lake_shows(lake: Path, name: str) -> str:
    """status.json, definition.json and every cell of every status table, as text."""
    lake_ = Lake.at(lake)
    texts = [lake_.status_path(name).read_text(), lake_.definition_path(name).read_text()]
    for table in STATUS_SCHEMAS:
        texts.append(json.dumps(read_status_table(lake_, table).to_pylist(), default=str))
    return "\n".join(texts)


def test_sasl_password_from_the_environment_is_in_no_log_status_or_definition(
    broker, topic, produce, tmp_path, caplog, monkeypatch
):
    monkeypatch.setenv("RECLOCK_TEST_KAFKA_PASSWORD", SECRET)
    caplog.set_level(logging.DEBUG)  # every logger, kafka-python's included
    t = topic(partitions=2)
    produced = _produce(produce, t, range(50), partitions=2)
    name, lake = "secret", tmp_path / "lake"
    lifecycle.create(load_config(_secret_config(tmp_path, broker, name, t, "PLAINTEXT")))
    ends = _ends(produced)

    def stop_when_in() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            resume = Frontier.from_json(_status(lake, name).get("resume_frontier", "{}"))
            if all(resume.covers(p, e - 1) for p, e in ends.items()):
                break
            time.sleep(0.1)
        lifecycle.request_stop(Lake.at(lake), name)

    watcher = threading.Thread(target=stop_when_in, daemon=True)
    watcher.start()
    progress = io.StringIO()
    pipeline = lifecycle.run(Lake.at(lake), name, progress=progress, max_seconds=90)
    watcher.join()
    pipeline.source.close()
    assert pipeline.health is Health.STOPPED
    _assert_exactly_once(lake, name, {output_name_for(t): produced})  # the settings really were used

    definition = Lake.at(lake).definition_path(name).read_text()
    assert "${RECLOCK_TEST_KAFKA_PASSWORD}" in definition  # the reference is stored, never its value
    assert caplog.records and any(r.name.startswith("kafka") for r in caplog.records)
    for record in caplog.records:
        assert SECRET not in record.getMessage() and SECRET not in (record.exc_text or ""), record.name
    assert SECRET not in caplog.text and SECRET not in progress.getvalue()
    assert SECRET not in _everything_the_lake_shows(lake, name)
    assert SECRET not in repr(pipeline.source)


@pytest.mark.usefixtures("reclock_processes")  # a job whose logging is configured at its start
def test_sasl_password_stays_out_of_a_refused_jobs_debug_stderr_and_status(
    broker, topic, produce, tmp_path, monkeypatch
):
    """SASL_PLAINTEXT makes kafka-python attempt the handshake (Tansu refuses it): the job stalls
    and logs the failure. Its stderr carries every logger at DEBUG, kafka-python's included."""
    monkeypatch.setenv("RECLOCK_TEST_KAFKA_PASSWORD", SECRET)  # the job subprocesses inherit it
    t = topic()
    produce.send(t, [_value(t, 0)])
    name, lake = "refused", tmp_path / "lake"
    config = _secret_config(tmp_path, broker, name, t, "SASL_PLAINTEXT")
    assert reclock_in_process("create", str(config)).returncode == 0
    debug_job = (
        "import logging, sys; logging.basicConfig(level=logging.DEBUG); from reclock.cli.main import main; "
        f"sys.exit(main(['--lake', {str(lake)!r}, 'start', {name!r}, '--max-seconds', '5']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", debug_job], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-3000:]  # a stop while stalled is a clean stop
    assert "SaslHandshake" in done.stderr and "stalled" in done.stderr  # the failure is logged ...
    assert "sasl_plain_password" not in done.stderr and SECRET not in done.stderr + done.stdout  # ... the secret not
    status = _status(lake, name)
    assert status["health"] == "stopped" and status["batches"] == 0
    assert SECRET not in _everything_the_lake_shows(lake, name)


# -- 8. the demo ----------------------------------------------------------------------------------


@pytest.mark.kafka  # the demo's embedded broker
def test_demo_streams_the_generator_through_kafka_into_every_output_exactly_once(tmp_path):
    from reclock.demo.run import run_demo
    from tests.integration.helpers import expected_generator_offsets

    lake = Lake.at(tmp_path / "lake")
    out = io.StringIO()
    as_of = run_demo(lake, events=6_000, rate=1_000_000, engine="local", out=out)
    assert as_of is not None, out.getvalue()
    assert "embedded broker" in out.getvalue() and "produced 6,000 records" in out.getvalue()
    cut = read_as_of(lake, "demo", as_of)
    expected = {k: len(v) for k, v in expected_generator_offsets(4, 6_000).items()}
    assert {k: t.num_rows for k, t in cut.items()} == {**expected, ERRORS: 0}
    for output, table in cut.items():
        lineage = list(zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True))
        assert len(set(lineage)) == len(lineage), output
        assert {decode_partition(p)[0] for p, _ in lineage} <= {output}  # each topic feeds its own output
    status = _status(lake.root, "demo")
    assert status["health"] == "stopped" and not status["finished"]  # Kafka is unbounded: stopped, not finished


def test_demo_still_runs_the_generator_without_a_broker(tmp_path):
    from reclock.demo.run import run_demo

    lake = Lake.at(tmp_path / "lake")
    as_of = run_demo(lake, events=2_000, rate=1_000_000, engine="local", out=io.StringIO(), source="generator")
    assert as_of is not None
    assert sum(t.num_rows for t in read_as_of(lake, "demo", as_of).values()) == 2_000
    assert _status(lake.root, "demo")["finished"]


# -- 7. the guide -----------------------------------------------------------------------------------


def test_every_toml_example_of_the_kafka_guide_is_a_valid_definition(monkeypatch):
    """What ``reclock create`` checks (the source's own validation included), for each example."""
    import re
    import tomllib

    from reclock.job.config import build_source, parse_config

    monkeypatch.setenv("KAFKA_PASSWORD", SECRET)
    guide = Path(__file__).resolve().parents[3] / "docs" / "sources" / "kafka.md"
    examples = re.findall(r"```toml\n(.*?)```", guide.read_text(), re.DOTALL)
    assert len(examples) >= 5
    for text in examples:
        config = parse_config(tomllib.loads(text))
        source = build_source(config, created_at_ms=0)
        assert isinstance(source, KafkaSource) and source.group_id == f"reclock-{config.name}"
        assert SECRET not in repr(source)


# -- compressed topics, written by librdkafka -----------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_topic_compressed_by_librdkafka_lands_every_record_once_with_its_key_and_headers(
    broker, topic, codec, tmp_path
):
    """librdkafka (not kafka-python, whose batches the parser's unit test builds) compresses the
    batches; what the producer got acknowledged is the ground truth."""
    from confluent_kafka import Producer as Librdkafka

    name = topic(partitions=3)
    producer = Librdkafka({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20})
    acked: dict[tuple[int, int], tuple[int, bytes, list]] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        i = json.loads(msg.value())["id"]  # librdkafka's report drops the headers: they are what was sent
        acked[(msg.partition(), msg.offset())] = (i, msg.key(), [("n", str(i).encode())] if i % 3 == 0 else [])

    for i in range(3_000):
        headers = [("n", str(i).encode())] if i % 3 == 0 else None
        producer.produce(
            name, _value(name, i), key=f"k{i}".encode(), headers=headers, partition=i % 3, on_delivery=delivered
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    source = _kafka_source(broker, topics=[name], metadata={"key": "key", "headers": "headers"})
    pipeline = Pipeline("packed", tmp_path, source, settings=Settings(max_batch=1_000))
    _step_until_in(pipeline, {(name, p): 1 + max(o for q, o in acked if q == p) for p in range(3)})
    source.close()
    rows = _rows(tmp_path, "packed", output_name_for(name))
    got = {
        (decode_partition(r["_partition"])[1], r["_offset"]): (
            r["id"],
            r["key"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in rows
    }
    assert len(rows) == len(got) == 3_000
    assert got == {k: (i, key, [(hk, hv) for hk, hv in headers]) for k, (i, key, headers) in acked.items()}
    assert _rows(tmp_path, "packed", ERRORS) == []

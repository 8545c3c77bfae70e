"""How soon the Kafka source gives up on a broker that stopped answering, and how soon a broker stops.

The tests pin that each of these gives up, with the retryable error that names its wait
(``tests/integration/kafka/test_kafka_source.py``); how soon is speed, which a loaded machine
stretches, so it is measured here, as a ratio to the wait it is configured with:

* a read and an ``upper`` against a broker paused (SIGSTOP) before they start, and a read paused
  in its middle: time to :class:`SourceTimeout` / ``read_timeout_s``. kafka-python's own wait for a
  new connection's first answer is 10 s; a read once took 11.5 s that way, 7.7x a 1.5 s timeout.
  Target <= 4;
* :meth:`EmbeddedBroker.stop` with a client connected (Tansu drains clients for about 5 s on
  SIGTERM): time to stopped / the stop's own 1 s before SIGKILL. Target <= 4.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from benchmarks.harness import Ratio, ScenarioResult
from benchmarks.measure import load_average

__all__ = ["run"]

TARGET = 4.0
READ_TIMEOUT_S = 1.5
STOP_TIMEOUT_S = 1.0


def _seconds_to_raise(call: Callable[[], object]) -> float:
    from reclock.sources.kafka import SourceTimeout

    started = time.perf_counter()
    try:
        call()
    except SourceTimeout:
        return time.perf_counter() - started
    raise AssertionError("a call against a paused broker returned")


def _paused_reads(repeats: int) -> dict[str, list[float]]:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from reclock.demo.broker import EmbeddedBroker
    from reclock.sources.kafka import KafkaSource, KafkaSplit
    from reclock.timeline.frontier import Frontier

    times: dict[str, list[float]] = {"a read": [], "an upper": [], "a read paused in its middle": []}
    with EmbeddedBroker() as own:
        admin = KafkaAdminClient(bootstrap_servers=own.bootstrap)
        admin.create_topics([NewTopic("paused", 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=own.bootstrap)
        for i in range(20):
            producer.send("paused", b"%d" % i, partition=0)
        producer.flush()
        producer.close()
        for _ in range(repeats):
            source = KafkaSource(own.bootstrap, topics=["paused"], read_timeout_s=READ_TIMEOUT_S)
            (split,) = source.splits(Frontier(), source.upper())
            own.pause()
            try:
                times["a read"].append(_seconds_to_raise(lambda: list(source.read(split))))  # noqa: B023
                times["an upper"].append(_seconds_to_raise(source.upper))
            finally:
                own.resume()
            source.close()
            source = KafkaSource(own.bootstrap, topics=["paused"], read_timeout_s=READ_TIMEOUT_S)
            source.flush_rows = 5
            reading = source.read(KafkaSplit(("paused", 0), 0, 25))  # 5 more than exist: it must fetch again
            next(reading)
            own.pause()
            try:
                times["a read paused in its middle"].append(_seconds_to_raise(lambda: list(reading)))  # noqa: B023
            finally:
                own.resume()
            source.close()
    return times


def _stops(repeats: int) -> list[float]:
    from kafka import KafkaProducer

    from reclock.demo.broker import EmbeddedBroker

    times = []
    for _ in range(repeats):
        own = EmbeddedBroker().start()
        producer = KafkaProducer(bootstrap_servers=own.bootstrap)
        producer.send("t", b"x").get(timeout=60)
        started = time.perf_counter()
        own.stop(timeout_s=STOP_TIMEOUT_S)
        times.append(time.perf_counter() - started)
        producer.close(timeout=60)
    return times


def run(full: bool = False) -> ScenarioResult:
    repeats = 5 if full else 2
    result = ScenarioResult("kafka_timeouts")
    load = load_average()
    for what, seconds in _paused_reads(repeats).items():
        worst = max(seconds)
        result.ratios.append(
            Ratio(
                f"{what} of a paused broker, to SourceTimeout / read_timeout_s",
                worst / READ_TIMEOUT_S,
                TARGET,
                lower_is_better=True,
                detail=f"worst of {len(seconds)}: {worst:.2f} s against {READ_TIMEOUT_S} s",
            )
        )
        result.measurements[what] = seconds
    stops = _stops(repeats)
    result.ratios.append(
        Ratio(
            "broker stop with a client connected / its timeout before SIGKILL",
            max(stops) / STOP_TIMEOUT_S,
            TARGET,
            lower_is_better=True,
            detail=f"worst of {len(stops)}: {max(stops):.2f} s against {STOP_TIMEOUT_S} s",
        )
    )
    result.measurements["stop"] = stops
    result.measurements["load_average"] = load
    return result

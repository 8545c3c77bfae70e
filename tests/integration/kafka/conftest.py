"""Kafka fixtures: one embedded Tansu broker for the session, a fresh topic per test.

Each test names its own topics (test name + a random suffix), so tests never see each other's
records even though they share the broker. The producer helper returns the broker's delivery
coordinates ``(topic, partition, offset)``, which is the independent record count the tests
compare reads against.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

import pytest

from reclock.demo.broker import EmbeddedBroker
from tests.waiting import PATIENCE_S


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def admin(broker: EmbeddedBroker):
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=5000)
    yield client
    client.close()


@pytest.fixture
def topic(broker: EmbeddedBroker, admin, request) -> Callable[..., str]:
    """``topic(partitions=1, name=None) -> name``: create a topic of this test's own."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]

    def make(partitions: int = 1, name: str | None = None) -> str:
        from kafka.admin import NewTopic

        name = name or f"{base}-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, partitions, 1)])
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            described = admin.describe_topics([name])
            if described and len(described[0].get("partitions", [])) == partitions:
                return name
            time.sleep(0.05)
        raise AssertionError(f"topic {name} did not appear with {partitions} partitions")

    return make


class Producer:
    """A kafka-python producer that reports where each record landed."""

    def __init__(self, bootstrap: str) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=16384)

    def send(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        partition: int | Callable[[int], int] | None = 0,
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[list[tuple[str, bytes]]] | None = None,
        timestamp_ms: int | None = None,
    ) -> list[tuple[str, int, int]]:
        """Send and flush; ``partition`` is a number, a function of the index, or None (hashing)."""
        futures = []
        for i, value in enumerate(values):
            p = partition(i) if callable(partition) else partition
            futures.append(
                self._producer.send(
                    topic,
                    value=value,
                    key=keys[i] if keys is not None else None,
                    partition=p,
                    headers=headers[i] if headers is not None else None,
                    timestamp_ms=timestamp_ms,
                )
            )
        self._producer.flush()
        return [(m.topic, m.partition, m.offset) for m in (f.get(timeout=PATIENCE_S) for f in futures)]

    def close(self) -> None:
        self._producer.close()


@pytest.fixture
def produce(broker: EmbeddedBroker) -> Iterator[Producer]:
    producer = Producer(broker.bootstrap)
    yield producer
    producer.close()

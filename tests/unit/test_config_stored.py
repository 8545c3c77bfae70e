"""Definitions stored in a lake by today's code still load, and load to what they say.

``reclock create`` stores ``config.to_dict()`` as ``definition.json`` and a later ``create``
compares the stored one with the new one key for key, so parsing and serialising must keep
every stored definition exactly: the two below are written as the code of 2026-12-02 wrote them
(every section set, and none but the required ones).
"""

from __future__ import annotations

import json

from reclock.job.config import DEFAULT_SPARK_START_TIMEOUT_S, parse_config
from reclock.job.control import load
from reclock.persist.lake import Lake
from reclock.persist.lease import DEFAULT_TTL_S
from reclock.runtime.settings import Maintenance, Settings

#: Every section and key set, as ``to_dict`` wrote it (floats as floats, Spark conf as strings).
EVERYTHING = {
    "lease": {"ttl_seconds": 10.0},
    "maintenance": {"every": 100, "history_minutes": 30, "target_file_mb": 128},
    "outputs": {
        "bids": {"partition_by": ["_into_date"], "schema_evolution": "none"},
        "big_bids": {"from": "bids", "sql": "SELECT auction, price FROM input WHERE price > 1000"},
    },
    "pipeline": {
        "batch_interval": 0.5,
        "engine": "local",
        "file_rows": 1000000,
        "idle_interval": 10.0,
        "lake": "/lakes/auctions",
        "max_backoff": 30.0,
        "max_batch": 5000,
        "max_retries": 3,
        "metrics_host": "0.0.0.0",
        "metrics_port": 9108,
        "name": "auctions",
        "on_record_error": "fail",
        "retry_backoff": 1.0,
        "status_retention_days": 3.0,
        "stop_on_error": False,
    },
    "source": {"kind": "generator", "limit": 20000, "rate": 2000},
    "spark": {
        "background_start": False,
        "conf": {"spark.sql.shuffle.partitions": "4"},
        "master": "local[1]",
        "small_batch_offsets": 0,
        "start_timeout_seconds": 60.0,
        "ui": True,
    },
    "windows": [
        {
            "aggregates": {"n": "count(*)"},
            "group_by": [],
            "max_groups": 100000,
            "name": "per_minute",
            "output": "bids",
            "size_ms": 60000,
        }
    ],
}

#: Only what a definition must say, and the defaults ``to_dict`` writes for the rest; the record
#: error policy where the source guides long wrote it, under ``[source]``.
LEAST = {
    "maintenance": {"every": 500, "history_minutes": 0, "target_file_mb": 128},
    "pipeline": {
        "batch_interval": 1.0,
        "engine": "spark",
        "file_rows": 1000000,
        "idle_interval": 10.0,
        "lake": "/lakes/orders",
        "max_backoff": 30.0,
        "max_batch": 1000000,
        "max_retries": 3,
        "name": "orders",
        "retry_backoff": 1.0,
        "status_retention_days": 7.0,
        "stop_on_error": True,
    },
    "source": {"kind": "generator", "on_record_error": "fail", "rate": 10},
    "spark": {"background_start": True, "conf": {}, "master": "local[2]", "small_batch_offsets": 20000},
}


def test_a_definition_with_every_section_loads_to_what_it_says_and_is_stored_again_unchanged():
    config = parse_config(json.loads(json.dumps(EVERYTHING)))
    assert config.to_dict() == EVERYTHING
    assert (config.name, config.lake, config.engine, config.status_retention_days) == (
        "auctions",
        "/lakes/auctions",
        "local",
        3.0,
    )
    assert config.settings == Settings(batch_interval=0.5, max_batch=5000, stop_on_error=False)
    assert (config.metrics_port, config.metrics_host, config.on_record_error) == (9108, "0.0.0.0", "fail")
    assert (config.spark_master, dict(config.spark_conf), config.small_batch_offsets) == (
        "local[1]",
        {"spark.sql.shuffle.partitions": "4"},
        0,
    )
    assert (config.spark_background_start, config.spark_start_timeout_s, config.spark_ui) == (False, 60.0, True)
    assert config.maintenance == Maintenance(every=100, history_minutes=30)
    assert config.lease_ttl_s == 10.0
    assert [w.name for w in config.windows] == ["per_minute"]
    assert list(config.layouts) == ["bids"] and [s.name for s in config.shapes] == ["big_bids"]


def test_a_least_definition_loads_with_the_defaults_and_is_stored_again_unchanged():
    config = parse_config(json.loads(json.dumps(LEAST)))
    assert config.to_dict() == LEAST
    assert config.settings == Settings() and config.maintenance == Maintenance()
    assert (config.spark_master, config.small_batch_offsets, config.spark_background_start) == ("local[2]", 20000, True)
    assert (config.spark_start_timeout_s, config.spark_ui) == (DEFAULT_SPARK_START_TIMEOUT_S, False)
    assert (config.lease_ttl_s, config.metrics_port, config.metrics_host) == (DEFAULT_TTL_S, None, "127.0.0.1")
    assert config.on_record_error == "fail" and config.source["on_record_error"] == "fail"
    assert (config.windows, dict(config.layouts), config.shapes) == ((), {}, ())


def test_a_definition_file_as_create_wrote_it_loads_from_the_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    path = lake.definition_path("auctions")
    lake.store.makedirs(path.parent)
    lake.store.write_text(path, json.dumps({"definition": EVERYTHING, "created_at_ms": 1764633600000}, indent=1))
    config, created_at = load(lake, "auctions")
    assert config.to_dict() == EVERYTHING and created_at == 1764633600000

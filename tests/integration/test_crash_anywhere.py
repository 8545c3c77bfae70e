"""Crash anywhere, short mode: real jobs SIGKILLed at random moments, checked from outside.

One campaign of :mod:`tests.faults.crash` runs for the whole module (about a minute): a Kafka
pipeline (appended and upsert outputs) and a files pipeline, each killed 6 times (2 of them on
Spark, one in its JVM's start-up), then caught up and stopped cleanly. Each test asserts one of
the promises on the campaign's report, so a failure names the promise that broke. With ``--long``
(``scripts/test --long``) the campaign is the long one of docs/reliability.md: 100 kills per
pipeline, 4 of them on Spark, about 16 minutes.
"""

from __future__ import annotations

import pytest

from tests.faults.crash import DROPS, STREAMS, Campaign, Report, run_campaign

# Its own broker and Spark jobs, all in `reclock start` subprocesses: no fixture brings them up.
pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.usefixtures("reclock_processes")]


@pytest.fixture(scope="module")
def campaign(long_lane) -> Campaign:
    return Campaign(kills=100, spark_kills=4, seed=1) if long_lane else Campaign(kills=6, spark_kills=2, seed=8)


@pytest.fixture(scope="module")
def report(tmp_path_factory, campaign) -> Report:
    return run_campaign(tmp_path_factory.mktemp("crash"), campaign)


def test_every_job_was_killed_as_planned_and_none_died_on_its_own(report, campaign):
    assert not report.anomalies, report.anomalies
    for source in (STREAMS, DROPS):
        kills = [k for k in report.kills if k.source == source]
        assert len(kills) == campaign.kills
        assert sum(k.engine == "spark" for k in kills) == campaign.spark_kills
        assert any(k.engine == "spark" and k.phase == "start-up" for k in kills), kills  # in the JVM's start-up
        assert sum(k.phase == "running" for k in kills) >= 3, kills  # among batches and commits
    assert report.acked >= 1000 and report.lines_dropped >= 300  # a few thousand records, really fed


def test_every_acked_record_and_every_dropped_line_lands_exactly_once_with_its_payload(report):
    assert report.checked >= report.acked // 2 + report.lines_dropped
    assert report.lost == []
    assert report.duplicated == []
    assert report.unexpected == []
    assert report.wrong_payload == []


def test_every_row_is_stamped_as_the_durable_bindings_say(report):
    assert report.wrong_into_ts == []


def test_maintenance_ran_under_fire_and_compacted_both_remap_tables(report):
    """Every 4 batches the jobs maintain their tables, so kills also land in maintenance; the
    checks above then read tables whose old log and files are gone."""
    assert set(report.compacted_since) == {"streams", "drops"}
    assert all(since is not None for since in report.compacted_since.values()), report.compacted_since


def test_the_consumer_groups_committed_offsets_never_ran_ahead_of_the_outputs(report):
    assert report.group_observations >= 100 and report.group_commits_seen >= 20
    assert report.group_violations == []
    assert report.group_final == report.acked_ends  # and the group ends holding every acked record


def test_reclock_files_lists_every_loaded_file(report):
    assert report.files_unlisted == []

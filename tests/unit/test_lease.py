"""The job lease on a local lake: take, refuse, renew, expire, take over, lose, release.

Real processes where a process matters (a holder that dies, drivers racing to take over); time is
injected where only the clock matters (an expiry), so no test waits out a real ttl unless it pins
what a real pause does.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

from reclock.errors import ConfigError
from reclock.job.config import parse_config
from reclock.job.status import Status, job_alive, read_status
from reclock.persist import conditional
from reclock.persist.lake import Lake
from reclock.persist.lease import DEFAULT_TTL_S, Holder, Lease, LeaseHeld, LeaseLost, LeaseRecord, read_lease
from reclock.timeline.frontier import wall_clock_ms
from tests.waiting import PATIENCE_S


def later(seconds: float):
    """A clock ``seconds`` ahead of the wall clock: another driver's view after that long."""
    return lambda: wall_clock_ms() + round(seconds * 1000)


def test_a_second_driver_is_refused_in_one_line_naming_the_holder_and_its_expiry(tmp_path):
    lake = Lake.at(tmp_path)
    first = Lease.acquire(lake, "p", 30)
    with pytest.raises(LeaseHeld) as refused:
        Lease.acquire(lake, "p", 30)
    message = str(refused.value)
    expiry = time.strftime("%H:%M:%S UTC", time.gmtime(first.record.expires_ms / 1000))
    assert f"pipeline 'p' is already running (pid {os.getpid()}) on " in message
    assert f"its lease live until {expiry}" in message and "\n" not in message
    first.release()
    assert read_lease(lake, "p").released
    Lease.acquire(lake, "p", 30).release()  # a released lease is free at once


def test_an_expired_lease_is_taken_over_and_its_old_holder_finds_it_lost(tmp_path):
    lake = Lake.at(tmp_path)
    old = Lease.acquire(lake, "p", 5)
    with pytest.raises(LeaseHeld):
        Lease.acquire(lake, "p", 5, now=later(4.9))
    new = Lease.acquire(lake, "p", 5, now=later(5.1))
    assert read_lease(lake, "p").holder == new.record.holder != old.record.holder
    with pytest.raises(LeaseLost, match="lost its lease: it was taken over by pid"):
        old.renew()
    with pytest.raises(LeaseLost):
        old.check()
    old.release()  # a lost lease is not released: that would free the new holder's
    assert read_lease(lake, "p") == new.record and not new.lost
    new.renew()
    new.release()


def test_renewal_extends_the_expiry_and_keeps_the_lease_across_many_renewals(tmp_path):
    lake = Lake.at(tmp_path)
    lease = Lease.acquire(lake, "p", 3)
    lease.start_renewing()
    first = lease.record.expires_ms
    time.sleep(3.5)  # longer than the ttl: only renewals keep it
    assert read_lease(lake, "p").expires_ms > first + 500
    with pytest.raises(LeaseHeld):
        Lease.acquire(lake, "p", 3)
    lease.check()
    lease.release()
    assert not read_lease(lake, "p").live(wall_clock_ms())


def test_a_driver_that_slept_through_its_expiry_finds_out_at_its_next_check(tmp_path):
    """No renewer ran (as in a paused process): check() renews itself, and sees the takeover."""
    lake = Lake.at(tmp_path)
    paused = Lease.acquire(lake, "p", 1)
    time.sleep(0.8)  # past two thirds of the ttl: check() must renew before it says yes
    before = paused.record.expires_ms
    paused.check()
    assert paused.record.expires_ms > before, "check() did not renew a lease near its expiry"
    time.sleep(1.1)  # expired now
    Lease.acquire(lake, "p", 1)
    with pytest.raises(LeaseLost):
        paused.check()


@pytest.mark.usefixtures("reclock_processes")
def test_a_lease_whose_holder_died_on_this_machine_is_taken_at_once(tmp_path):
    lake = Lake.at(tmp_path)
    code = (
        "import sys, time\n"
        "from reclock.persist.lake import Lake\n"
        "from reclock.persist.lease import Lease\n"
        f"Lease.acquire(Lake.at({str(tmp_path)!r}), 'p', 600)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid}"):
            Lease.acquire(lake, "p", 600)
        assert job_alive(lake, "p")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert read_lease(lake, "p").expires_ms > wall_clock_ms() + 500_000, "the dead holder's lease is still unexpired"
    assert not job_alive(lake, "p")
    Lease.acquire(lake, "p", 600).release()


def _take(root: str, go, results) -> None:
    go.wait()
    try:
        Lease.acquire(Lake.at(root), "p", 60)
        results.put("won")
    except LeaseHeld:
        results.put("refused")


def test_drivers_racing_to_take_one_expired_lease_elect_exactly_one(tmp_path):
    lake = Lake.at(tmp_path)
    Lease.acquire(lake, "p", 60, now=later(-120))  # long expired, holder alive (this process)
    context = multiprocessing.get_context("fork")
    go, results = context.Event(), context.Queue()
    racers = [context.Process(target=_take, args=(str(tmp_path), go, results)) for _ in range(6)]
    for racer in racers:
        racer.start()
    go.set()
    outcomes = sorted(results.get(timeout=60) for _ in racers)
    for racer in racers:
        racer.join(timeout=60)
    assert outcomes == ["refused"] * 5 + ["won"]


def test_a_conditional_put_against_a_stale_tag_writes_nothing(tmp_path):
    path = tmp_path / "control" / "x.json"
    with pytest.raises(conditional.Conflict):
        conditional.put(Lake.at(tmp_path).store, path, "a", "some-tag")  # absent, but a tag expected
    first = conditional.put(Lake.at(tmp_path).store, path, "a", None)
    with pytest.raises(conditional.Conflict):
        conditional.put(Lake.at(tmp_path).store, path, "b", None)  # present: not put-if-absent
    second = conditional.put(Lake.at(tmp_path).store, path, "b", first)
    with pytest.raises(conditional.Conflict):
        conditional.put(Lake.at(tmp_path).store, path, "c", first)
    assert conditional.read(Lake.at(tmp_path).store, path) == ("b", second)


def test_status_believes_a_running_snapshot_only_while_the_lease_holder_runs(tmp_path):
    """Elsewhere the expiry tells; on this machine the holder's process does: a live job that cannot
    renew (a read-only lake) is not dead, and a killed one is dead before its lease expires."""
    lake = Lake.at(tmp_path)
    path = lake.lease_path("p")
    snapshot = Status(pipeline="p", health="running", pid=4242, updated_ms=wall_clock_ms())
    lake.store.write_text(lake.status_path("p"), json.dumps(dataclasses.asdict(snapshot)))  # as a job left it
    assert read_status(lake, "p")["health"] == "dead"  # no lease at all
    # Its expiry far off (a loaded machine may take seconds between the write and the read), then past.
    holder = Holder("another-host", 4242, "token")
    elsewhere = LeaseRecord("p", holder, wall_clock_ms() + int(10 * PATIENCE_S * 1000), 1500)
    tag = conditional.put(lake.store, path, elsewhere.to_json(), None)
    assert read_status(lake, "p")["health"] == "running"
    tag = conditional.put(lake.store, path, LeaseRecord("p", holder, wall_clock_ms() - 1, 1500).to_json(), tag)
    shown = read_status(lake, "p")
    assert shown["health"] == "dead" and "pid 4242" in shown["last_error"]

    expired_here = LeaseRecord("p", Holder.this_process(), wall_clock_ms() - 1000, 1500)
    conditional.put(lake.store, path, expired_here.to_json(), tag)
    assert read_status(lake, "p")["health"] == "running"  # this process runs, though it did not renew
    assert not expired_here.live(wall_clock_ms()), "an expired lease must still be free to take over"


def test_the_ttl_is_configured_in_a_lease_section_validated_in_one_line(tmp_path):
    base = {"pipeline": {"name": "p"}, "source": {"kind": "generator"}}
    assert parse_config(base).lease_ttl_s == DEFAULT_TTL_S
    assert "lease" not in parse_config(base).to_dict()  # stored definitions of older versions stay equal
    config = parse_config({**base, "lease": {"ttl_seconds": 3}})
    assert config.lease_ttl_s == 3.0 and config.to_dict()["lease"] == {"ttl_seconds": 3.0}
    assert parse_config(json.loads(json.dumps(config.to_dict()))) == config
    for section, expected in (
        ({"ttl_seconds": 0.5}, "lease.ttl_seconds: must be a finite number of seconds >= 1, got 0.5"),
        ({"ttl_seconds": "30s"}, "lease.ttl_seconds: expected a number, got '30s'"),
        ({"ttl": 30}, "lease.ttl: unknown key (known: ttl_seconds)"),
    ):
        with pytest.raises(ConfigError) as bad:
            parse_config({**base, "lease": section}, file="p.toml")
        assert str(bad.value) == f"p.toml: {expected}"


def test_the_lease_requests_to_an_object_store_carry_the_conditions_and_a_valid_signature():
    """The conditional PUTs go to the store as AWS's own SDK sends them: ``If-None-Match`` /
    ``If-Match`` as asked, signed with the lake's key (and session token) for its region, a
    signature the store can verify, or a real S3 would refuse every lease. Read off the wire."""
    from tests.store_recorder import StoreRecorder

    with StoreRecorder() as store:
        for token in (None, "a-session-token"):
            options = {
                "endpoint": store.endpoint,
                "region": "eu-west-1",
                "access_key_id": "AKIDEXAMPLE",
                "secret_access_key": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                **({"session_token": token} if token else {}),
            }
            lake = Lake.at("s3://bucket/lake", options)
            path = lake.root / "p q" / "lease.json"
            store.answer(200, etag='"first"')
            assert conditional.put(lake.store, path, '{"lease": 1}', None) == '"first"'
            store.answer(200, etag='"second"')
            assert conditional.put(lake.store, path, '{"lease": 2}', '"first"') == '"second"'
            store.answer(412)
            with pytest.raises(conditional.Conflict):
                conditional.put(lake.store, path, '{"lease": 3}', '"first"')
            store.answer(404)
            assert conditional.read(lake.store, path) is None

            absent, present, stale, read = store.requests[-4:]
            assert (absent.method, absent.path) == ("PUT", "/bucket/lake/p%20q/lease.json")
            assert absent.headers["If-None-Match"] == "*" and "If-Match" not in absent.headers
            assert present.headers["If-Match"] == '"first"' and stale.headers["If-Match"] == '"first"'
            assert (absent.body, present.body, read.method) == (b'{"lease": 1}', b'{"lease": 2}', "GET")
            for request in (absent, present, stale, read):
                assert request.signed_by(options["access_key_id"], options["secret_access_key"], token, "eu-west-1")
            assert ("X-Amz-Security-Token" in absent.headers) == (token is not None)
            assert not absent.signed_by(options["access_key_id"], "another-secret", token, "eu-west-1")

"""Acceptance of issue 21 item 3: redrive under SIGKILL, over a shaped, routed and windowed pipeline.

A generator pipeline (the source is deterministic, so the test reads every record it produced
from the generator itself, as a feed's acks) shapes ``bids`` in place with a division that fails
for one bidder in seven, routes ``bids`` into ``pricey`` through a second division that fails for
one auction in five (``WHERE price > 100000`` filters about half), and keeps a window table over
each. Rounds of: a job on the broken definition, SIGKILLed while it loads (new records fail into
``_errors``); the definition fixed; ``reclock redrive`` SIGKILLed at a random moment (before its
request, between the request and its landing, while it lands); and now and then a ``reclock
start`` SIGKILLed while it lands a pending request. At the end one redrive and one start run to
completion. A definition is replaced only once the pipeline finished the batch a kill left half
committed (``create --replace`` refuses until then). Everything is checked from outside
(``tests.faults.reader``, polars):

* every bid is in ``bids`` exactly once and every bid above the price in ``pricey`` exactly once,
  with the shaped columns the fixed SQL computes (a redriven record lands shaped, not raw);
* every ``_errors`` row is a transform failure of a bid, naming the output it failed for, and that
  output holds the bid at a later into time: the ``_errors`` rows stay as history, so produced =
  every output's rows plus the rows filtered, with each record's failures before its row;
* every row's ``_into_ts`` is its binding by the reclock rule, or the binding of a redrive of it;
* the rows filtered, over the ``batches`` status table, are exactly the bids at or below the price;
* every window table equals a polars recomputation over its output, window by window, commit by
  commit (:func:`tests.integration.test_windows.check_windows`).

Five kills of a redrive or of the start landing it by default (the loading jobs' kills come on
top); the long lane (``scripts/test --long``) runs thirty.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from reclock.job.status import read_status
from reclock.persist.lake import Lake
from reclock.sources.base import Split
from reclock.sources.generator import BIDS, GeneratorSource
from tests import zygote
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.integration.helpers import reclock_cli
from tests.integration.test_windows import check_windows
from tests.waiting import PATIENCE_S, run_until

# Its jobs are `reclock` subprocesses, SIGKILLed: the fixture kills what of them a failure leaves.
pytestmark = pytest.mark.usefixtures("reclock_processes")

NAME = "auctions"
PARTITIONS = 2
PRICE = 100_000
SHARE = {
    "broken": "1000 / (bidder % 7)",
    "fixed": "1000 / (bidder % 7 + CAST(bidder % 7 = 0 AS BIGINT))",
}
PER = {
    "broken": "price / (auction % 5)",
    "fixed": "price / (auction % 5 + CAST(auction % 5 = 0 AS BIGINT))",
}
WINDOWS = [
    {
        "name": "shares",
        "output": "bids",
        "size_ms": 700,
        "group_by": ["channel"],
        "aggregates": {"n": "count(*)", "s": "sum(share)"},
    },
    {
        "name": "dear",
        "output": "pricey",
        "size_ms": 500,
        "group_by": [],
        "aggregates": {"n": "count(*)", "top": "max(price)"},
    },
]


def definition(path: Path, lake: Path, version: str) -> Path:
    text = f"""
[pipeline]
name = "{NAME}"
lake = {json.dumps(str(lake))}
engine = "local"
batch_interval = 0.05
idle_interval = 0.2
max_batch = 2000

[source]
kind = "generator"
partitions = {PARTITIONS}
rate = 400

[outputs.bids]
sql = "SELECT auction, bidder, price, channel, {SHARE[version]} AS share FROM input"

[outputs.pricey]
from = "bids"
sql = "SELECT auction, price, {PER[version]} AS per FROM input WHERE price > {PRICE}"
"""
    for w in WINDOWS:
        text += "\n[[windows]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in w.items() if k != "aggregates")
        text += "[windows.aggregates]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in w["aggregates"].items())
    path.write_text(text)
    return path


def replace(config: Path, lake: Path, version: str) -> int:
    """``create --replace`` with ``version``; refused while a kill left a batch half committed, so
    then the pipeline first finishes it (start, stop), as an operator would. How often it was."""
    for finished in range(3):
        done = reclock_cli("create", str(definition(config, lake, version)), "--replace")
        if done.returncode == 0:
            return finished
        assert "stopped inside batch" in done.stderr, done.stderr
        job = launch(lake, "start", NAME)
        time.sleep(1.0)
        assert reclock_cli("--lake", str(lake), "stop", NAME, "--wait", "120").returncode == 0
        assert job.wait(timeout=120) == 0, job.stderr.read()[-3000:]
    raise AssertionError("the definition could not be replaced after finishing the batch")


def launch(lake: Path, *command: str) -> subprocess.Popen:
    return zygote.popen(
        ["--lake", str(lake), *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_after(job: subprocess.Popen, seconds: float) -> bool:
    """SIGKILL ``job``'s whole group after ``seconds``; whether it was still running then."""
    try:
        job.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=PATIENCE_S)
        return True
    assert job.returncode == 0, job.stderr.read()[-3000:]  # a run that ended on its own ended well
    return False


def wait_for_failed_records(lake: Path, job: subprocess.Popen) -> None:
    """Until the broken definition has sent records to ``_errors`` (seen from outside), so the
    campaign has failed records to redrive by construction: a kill timed from the launch alone
    can fall inside a start-up that a loaded machine stretches past it."""
    deadline = time.monotonic() + 120
    while not rows_of(lake, "_errors") and job.poll() is None:
        assert time.monotonic() < deadline, "the broken definition sent nothing to _errors in 120 s"
        time.sleep(0.1)


def rows_of(lake: Path, output: str) -> list[dict]:
    table = read_rows(DeltaLog(lake / NAME / "outputs" / output).refresh())
    return table.to_pylist() if table is not None else []


def produced_bids(remap: Remap) -> dict[tuple[str, int], dict]:
    """Every bid the generator produced below the bound frontier, from the generator itself."""
    source = GeneratorSource(partitions=PARTITIONS, rate=400)
    out = {}
    for p in range(PARTITIONS):
        partition = f"gen-{p}"
        bound = remap.frontier_at(max(remap.times)).get(partition, 0)
        for output, batch in source.read(Split(partition, 0, bound)):
            if output == BIDS:
                for r in batch.to_pylist():
                    out[(r["_partition"], r["_offset"])] = r
    return out


def test_redrive_under_sigkill_lands_every_failed_record_once_shaped_and_windows_stay_exact(tmp_path, long_lane):
    kills_wanted = 30 if long_lane else 5
    rng = random.Random(int(os.environ.get("RECLOCK_SEED", "21")))
    lake = tmp_path / "lake"
    config = tmp_path / "p.toml"
    assert reclock_cli("create", str(definition(config, lake, "broken"))).returncode == 0
    kills: Counter[str] = Counter()
    rounds = finished = 0
    while kills["redrive"] + kills["start (fixed)"] < kills_wanted and rounds < 6 * kills_wanted:
        rounds += 1
        finished += replace(config, lake, "broken")
        job = launch(lake, "start", NAME)
        wait_for_failed_records(lake, job)
        kills["start (broken)"] += kill_after(job, rng.uniform(1.5, 3.0))
        finished += replace(config, lake, "fixed")
        kills["redrive"] += kill_after(launch(lake, "redrive", NAME), rng.uniform(0.3, 3.5))
        if rng.random() < 0.5:  # a start lands a request its redrive was killed before landing
            kills["start (fixed)"] += kill_after(launch(lake, "start", NAME), rng.uniform(0.5, 2.5))
    assert kills["redrive"] + kills["start (fixed)"] >= kills_wanted, kills
    print(f"kills {dict(kills)} in {rounds} rounds; {finished} replaces waited for a half-committed batch")

    done = reclock_cli("--lake", str(lake), "redrive", NAME, timeout=300)
    assert done.returncode == 0 and "still failing 0" in done.stdout, done.stdout + done.stderr[-3000:]

    def batches() -> int:
        return read_status(Lake.at(str(lake)), NAME)["batches"]

    after_redrive = batches()  # a start lands what is due first: run it for two batches, then stop it
    run_until(Lake.at(str(lake)), NAME, lambda: batches() > after_redrive + 1, "two batches after the redrive")
    again = reclock_cli("--lake", str(lake), "redrive", NAME, timeout=300)
    assert again.returncode == 0 and "landed nothing; still failing 0" in again.stdout, again.stdout

    remap = Remap.read(lake / NAME / "remap")
    truth = produced_bids(remap)
    bids, pricey, errors = rows_of(lake, "bids"), rows_of(lake, "pricey"), rows_of(lake, "_errors")
    assert errors  # the rounds failed records

    # Every bid once in bids, and once in pricey when above the price, shaped by the fixed SQL.
    def share(b: int) -> int:
        return 1000 // (b % 7) if b % 7 else 1000

    def per(r: dict) -> int:
        return r["price"] // (r["auction"] % 5) if r["auction"] % 5 else r["price"]

    seen = Counter((r["_partition"], r["_offset"]) for r in bids)
    assert not [k for k, n in seen.items() if n > 1] and set(seen) == set(truth)
    for r in bids:
        want = truth[(r["_partition"], r["_offset"])]
        assert (r["auction"], r["bidder"], r["price"], r["channel"]) == tuple(
            want[c] for c in ("auction", "bidder", "price", "channel")
        )
        assert r["share"] == share(r["bidder"])
    dear = {k for k, r in truth.items() if r["price"] > PRICE}
    seen = Counter((r["_partition"], r["_offset"]) for r in pricey)
    assert not [k for k, n in seen.items() if n > 1] and set(seen) == dear
    assert all(r["per"] == per(truth[(r["_partition"], r["_offset"])]) for r in pricey)

    # _errors holds history only: each row a failure of a bid, before the row that landed it.
    landed = {
        "bids": {(r["_partition"], r["_offset"]): r["_into_ts"] for r in bids},
        "pricey": {(r["_partition"], r["_offset"]): r["_into_ts"] for r in pricey},
    }
    for e in errors:
        assert e["kind"] == "transform", e
        output = "bids" if e["message"].startswith("output 'bids'") else "pricey"
        key = (e["_partition"], e["_offset"])
        assert key in landed[output] and e["_into_ts"] < landed[output][key], e
        assert (share(truth[key]["bidder"]) if output == "bids" else per(truth[key])) is not None
    failed = {(e["_partition"], e["_offset"]) for e in errors}
    assert any(k in failed for k in landed["bids"]) and any(k in failed for k in landed["pricey"])

    # Every into time is the reclock rule's, or that of a redrive of the record.
    for r in [*bids, *pricey, *errors]:
        key = (r["_partition"], r["_offset"])
        assert remap.stamp_holds(*key, r["_into_ts"]) or r["_into_ts"] in remap.redriven_at(*key), r
    redriven = [r for r in [*bids, *pricey] if r["_into_ts"] in remap.redriven_at(r["_partition"], r["_offset"])]
    assert remap.redrives and redriven and all((r["_partition"], r["_offset"]) in failed for r in redriven)

    # produced = output + filtered + errors: what the transforms filtered, from the status rows.
    batches = [r for r in rows_of_status(lake) if r["pipeline"] == NAME and r["state"] == "Succeeded"]
    assert sum(r["filtered"] or 0 for r in batches) == len(truth) - len(dear)

    for window in WINDOWS:  # each window table equals a polars recomputation over its output
        check_windows(lake, NAME, window["output"], [window])


def rows_of_status(lake: Path) -> list[dict]:
    table = read_rows(DeltaLog(lake / "_status" / "batches").refresh())
    return table.to_pylist() if table is not None else []

"""``reclock redrive``: records in ``_errors`` land once the definition is fixed, exactly once.

A CSV file written with ``;`` is read with the default ``,``: every line fails to split into the
declared columns and lands in ``_errors``. A redrive before the fix fails them again (a new
``_errors`` row each, at the redrive's into time). After ``create --replace`` with
``csv_delimiter = ";"`` a redrive lands them, each once, at a new into time with their own
coordinates, so a read as of any earlier time is unchanged; a second redrive lands nothing. The
lake is read back with the test's own Delta-log reader against the lines the test wrote.
"""

from __future__ import annotations

import contextlib

from reclock.cli.main import main
from reclock.job.status import read_status
from reclock.persist.lake import Lake
from tests.faults.reader import DeltaLog, Remap, label_of, read_rows
from tests.waiting import run_until

CONFIG = """
[pipeline]
name = "people"
lake = "lake"
engine = "local"

[source]
kind = "files"
path = "in"
format = "csv"
columns = {{id = "int64", name = "string"}}
{extra}
"""


def _rows(lake, output, pipeline="people"):
    table = read_rows(DeltaLog(lake / pipeline / "outputs" / output).refresh())
    return table.to_pylist() if table is not None else []


def _start_until(pipeline: str, condition, what: str) -> None:
    """``reclock start`` of ``pipeline`` in ./lake until ``condition`` holds, then stopped: a files
    source never finishes, and what it lands in N seconds depends on the machine's load."""
    run_until(Lake.at("lake"), pipeline, condition, what)


def test_failed_records_land_once_after_the_fix_at_a_new_into_time_and_past_reads_stay(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.csv").write_text("id,name\n1,ann\n2,bob\n")
    (tmp_path / "in" / "semi.csv").write_text("id;name\n3;cy\n4;dee\n5;eve\n")
    (tmp_path / "p.toml").write_text(CONFIG.format(extra=""))
    assert main(["create", "p.toml"]) == 0
    lake = tmp_path / "lake"
    _start_until(
        "people",
        lambda: (
            len([r for r in _rows(lake, "_errors") if r["kind"] != "skipped"]) >= 3 and len(_rows(lake, "rows")) >= 2
        ),
        "both files read",
    )
    errors = [r for r in _rows(lake, "_errors") if r["kind"] != "skipped"]
    assert len(errors) == 3 and {r["_partition"] for r in errors} == {'["semi.csv",0]'}
    before = _rows(lake, "rows")
    assert sorted(r["id"] for r in before) == [1, 2]

    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "people"]) == 0  # nothing fixed yet: nothing lands
    assert "landed nothing; still failing 3" in capsys.readouterr().out
    assert sorted(r["id"] for r in _rows(lake, "rows")) == [1, 2]
    again = [r for r in _rows(lake, "_errors") if r["kind"] != "skipped"]
    assert len(again) == 6  # each attempt leaves its trace: the first rows stay, one more each
    assert {(r["_partition"], r["_offset"]) for r in again} == {(e["_partition"], e["_offset"]) for e in errors}

    (tmp_path / "p.toml").write_text(CONFIG.format(extra='csv_delimiter = ";"'))
    assert main(["create", "p.toml", "--replace"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "people"]) == 0
    assert "landed 3 into rows; still failing 0, landed before 0" in capsys.readouterr().out
    rows = _rows(lake, "rows")
    assert sorted((r["id"], r["name"]) for r in rows) == [(1, "ann"), (2, "bob"), (3, "cy"), (4, "dee"), (5, "eve")]
    remap = Remap.read(lake / "people" / "remap")
    redriven = [r for r in rows if r["id"] >= 3]
    newest_before = max(r["_into_ts"] for r in before + again)
    for r in redriven:  # its own coordinates, at the into time of the redrive that landed it
        assert (r["_partition"], r["_offset"]) in {(e["_partition"], e["_offset"]) for e in errors}
        assert r["_into_ts"] == remap.redriven_at(r["_partition"], r["_offset"])[-1] > newest_before
        assert r["_into_ts"] in remap.times  # a binding of its own, minted for the redrive
    # Stable past: as of any time before the redrive, the output reads exactly as it did.
    assert sorted(map(str, (r for r in rows if r["_into_ts"] <= newest_before))) == sorted(map(str, before))

    assert main(["--lake", "lake", "redrive", "people"]) == 0
    assert "landed nothing; still failing 0, landed before 3" in capsys.readouterr().out
    assert len(_rows(lake, "rows")) == 5  # exactly once


ROUTED = """
[pipeline]
name = "fractions"
lake = "lake"
engine = "local"
batch_interval = 0.05
idle_interval = 0.1

[source]
kind = "files"
path = "in"
format = "csv"
columns = {{num = "int64", den = "int64"}}

[outputs.ratio]
from = "rows"
sql = "SELECT num, {expression} AS r FROM input WHERE num >= 0"

[[windows]]
name = "per_num"
output = "ratio"
size_ms = 100
group_by = ["num"]
[windows.aggregates]
n = "count(*)"
"""
BROKEN, FIXED = "num / den", "num / NULLIF(den, 0)"
#: The same pipeline with ``rows`` itself shaped (no window): it commits before ``_errors``.
IN_PLACE = (
    ROUTED[: ROUTED.index("[outputs.ratio]")]
    + """[outputs.rows]
sql = "SELECT num, {expression} AS r FROM input WHERE num >= 0"
"""
)


def _fractions(tmp_path, monkeypatch) -> dict[tuple[str, int], tuple[int, int]]:
    """A files pipeline whose routed, windowed output ``ratio`` divides by a column that is zero on
    some lines (``rows`` lands every line as read); ground truth ``(file, offset) -> (num, den)``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    truth = {}
    for f in range(2):
        text = "num,den\n"
        for i in range(40):
            num, den = i % 9 - 2, i % 5
            truth[(f'["f{f}.csv",0]', len(text.encode()))] = (num, den)
            text += f"{num},{den}\n"
        (tmp_path / "in" / f"f{f}.csv").write_text(text)
    (tmp_path / "p.toml").write_text(ROUTED.format(expression=BROKEN))
    assert main(["create", "p.toml"]) == 0
    lake = tmp_path / "lake"
    bad = {k for k, (num, den) in truth.items() if num >= 0 and den == 0}
    _start_until(
        "fractions",
        lambda: (
            len(_rows(lake, "rows", "fractions")) >= len(truth)
            and len(_rows(lake, "_errors", "fractions")) >= len(bad)
            and _window_rows(lake)
        ),
        "every line read and a window emitted",
    )
    return truth


def _window_rows(lake) -> list[dict]:
    table = read_rows(DeltaLog(lake / "fractions" / "windows" / "per_num").refresh())
    return sorted(table.to_pylist(), key=lambda r: (r["_window_start"], r["num"])) if table is not None else []


def test_a_routed_record_lands_only_in_the_output_it_failed_for_and_emitted_windows_never_change(
    tmp_path, capsys, monkeypatch
):
    truth = _fractions(tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    bad = {k for k, (num, den) in truth.items() if num >= 0 and den == 0}
    errors = _rows(lake, "_errors", "fractions")
    assert {(r["_partition"], r["_offset"]) for r in errors} == bad and {r["kind"] for r in errors} == {"transform"}
    assert len(_rows(lake, "rows", "fractions")) == len(truth)  # the as-read route took every line, the bad ones too
    windows_before = _window_rows(lake)
    assert windows_before  # windows were emitted before the redrive

    (tmp_path / "p.toml").write_text(ROUTED.format(expression=FIXED))
    assert main(["create", "p.toml", "--replace"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "fractions"]) == 0
    assert f"landed {len(bad)} into ratio; still failing 0" in capsys.readouterr().out  # not into rows
    assert len(_rows(lake, "rows", "fractions")) == len(truth)
    ratio = _rows(lake, "ratio", "fractions")
    by_coordinate = {(r["_partition"], r["_offset"]): r for r in ratio}
    assert len(by_coordinate) == len(ratio)  # each record once
    assert by_coordinate.keys() == {k for k, (num, _) in truth.items() if num >= 0}
    assert all(by_coordinate[k]["r"] is None and by_coordinate[k]["num"] == truth[k][0] for k in bad)
    redriven = {by_coordinate[k]["_into_ts"] for k in bad}
    assert len(redriven) == 1 and min(redriven) > max(r["_window_end"] for r in windows_before)

    _start_until(  # closes the next windows
        "fractions",
        lambda: any(r["_window_start"] <= min(redriven) < r["_window_end"] for r in _window_rows(lake)),
        "the window of the redriven records",
    )
    windows = _window_rows(lake)
    assert windows[: len(windows_before)] == windows_before  # an emitted window never changes
    assert sum(r["n"] for r in windows) == len(ratio)  # every row, the redriven too, in exactly one window
    [late] = [r for r in windows if r["_window_start"] <= min(redriven) < r["_window_end"]][:1] or [None]
    assert late is not None and late not in windows_before


def test_a_redrive_killed_after_its_request_is_landed_by_the_next_start_once(tmp_path, capsys, monkeypatch):
    from reclock.job import lifecycle

    truth = _fractions(tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    bad = {k for k, (num, den) in truth.items() if num >= 0 and den == 0}
    (tmp_path / "p.toml").write_text(ROUTED.format(expression=FIXED))
    assert main(["create", "p.toml", "--replace"]) == 0

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies right after the request's commit

    with monkeypatch.context() as patch:
        patch.setattr(lifecycle, "run", killed)
        with contextlib.suppress(KeyboardInterrupt):
            main(["--lake", "lake", "redrive", "fractions"])
    assert len(_rows(lake, "ratio", "fractions")) == len(truth) - len(bad) - sum(1 for n, _ in truth.values() if n < 0)
    assert len(Remap.read(lake / "fractions" / "remap").redrives) > 0  # durable, not landed yet

    landed = sum(n >= 0 for n, _ in truth.values())
    _start_until("fractions", lambda: len(_rows(lake, "ratio", "fractions")) >= landed, "the redrive landed")
    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "fractions"]) == 0  # nothing is due twice
    assert f"landed nothing; still failing 0, landed before {len(bad)}" in capsys.readouterr().out
    ratio = _rows(lake, "ratio", "fractions")
    assert len({(r["_partition"], r["_offset"]) for r in ratio}) == len(ratio) == sum(n >= 0 for n, _ in truth.values())


def test_a_redrive_killed_between_two_outputs_commits_lands_each_record_once(tmp_path, capsys, monkeypatch):
    from reclock.persist.sink import OutputSink

    truth = _fractions(tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    bad = {k for k, (num, den) in truth.items() if num >= 0 and den == 0}
    (tmp_path / "p.toml").write_text(ROUTED.format(expression=FIXED))
    assert main(["create", "p.toml", "--replace"]) == 0
    commit = OutputSink.commit
    redrive_at: list[int] = []

    def dies_after_one_output(self, files, binding_ts, **kwargs):
        redrive_at[:] = redrive_at or [r["into_ts"] for r in Remap.read(lake / "fractions" / "remap").redrives]
        done = commit(self, files, binding_ts, **kwargs)
        if binding_ts == redrive_at[0]:
            raise KeyboardInterrupt  # dead between this output's commit and the next one's
        return done

    with monkeypatch.context() as patch:
        patch.setattr(OutputSink, "commit", dies_after_one_output)
        with contextlib.suppress(KeyboardInterrupt):
            main(["--lake", "lake", "redrive", "fractions"])
    labels = {
        o: label_of(DeltaLog(lake / "fractions" / "outputs" / o).refresh(), f"reclock/fractions/{o}")
        for o in ("rows", "ratio", "_errors")
    }
    assert max(labels.values()) == redrive_at[0] and min(labels.values()) < redrive_at[0]  # half landed

    landed = sum(n >= 0 for n, _ in truth.values())
    _start_until("fractions", lambda: len(_rows(lake, "ratio", "fractions")) >= landed, "the redrive landed")
    ratio = _rows(lake, "ratio", "fractions")
    assert len({(r["_partition"], r["_offset"]) for r in ratio}) == len(ratio) == landed
    assert sum(r["_into_ts"] == redrive_at[0] for r in ratio) == len(bad)
    assert len(_rows(lake, "rows", "fractions")) == len(truth)


def test_records_the_source_cannot_read_again_are_traced_and_do_not_wedge_the_pipeline(tmp_path, capsys, monkeypatch):
    truth = _fractions(tmp_path, monkeypatch)
    lake = tmp_path / "lake"
    bad = {k for k, (num, den) in truth.items() if num >= 0 and den == 0}
    (tmp_path / "in" / "f1.csv").unlink()  # archived after it was loaded
    (tmp_path / "p.toml").write_text(ROUTED.format(expression=FIXED))
    assert main(["create", "p.toml", "--replace"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "fractions"]) == 0
    gone = {k for k in bad if k[0] == '["f1.csv",0]'}
    assert (
        f"landed {len(bad) - len(gone)} into ratio; still failing 0, landed before 0, gone from the source {len(gone)}"
        in (capsys.readouterr().out)
    )
    traces = [r for r in _rows(lake, "_errors", "fractions") if r["kind"] == "unreadable"]
    assert {(r["_partition"], r["_offset"]) for r in traces} == gone and len(traces) == len(gone)
    assert main(["--lake", "lake", "redrive", "fractions"]) == 0  # not due again: nothing to read
    assert "landed nothing" in capsys.readouterr().out
    batches = read_status(Lake.at("lake"), "fractions")["batches"]
    _start_until(  # not wedged
        "fractions", lambda: read_status(Lake.at("lake"), "fractions")["batches"] > batches, "a batch after the redrive"
    )
    assert read_status(Lake.at("lake"), "fractions")["health"] == "stopped"


def test_a_record_is_due_once_per_failure_and_only_for_the_outputs_it_failed_for():
    from reclock.job.redrive import due
    from reclock.persist.remap import Redrive

    f = ("f.csv", 0)
    failed = {
        (f, 1): [(10, None)],  # failed to decode, never redriven: due, for every output
        (f, 2): [(10, "ratio")],  # a transform failed: due for that output only
        (f, 3): [(10, None)],  # redriven at 20, which every output holds: landed before
        (f, 4): [(10, None), (20, None)],  # redriven at 20 and failed again there: due again
        (f, 5): [(10, None), (20, "ratio")],  # redriven at 20, decoded, then ratio failed: ratio only
        (f, 6): [(10, "ratio")],  # redriven at 40, not landed yet: neither due nor landed
        (f, 7): [(10, "ratio"), (20, None)],  # redriven into ratio at 20, failed to decode: still ratio only
    }
    redrives = [Redrive(20, f, 3, 6), Redrive(40, f, 6, 7, ("ratio",)), Redrive(20, f, 7, 8, ("ratio",))]
    wanted, already = due(failed, redrives, 30)
    assert wanted == {(f, 1): (), (f, 2): ("ratio",), (f, 4): (), (f, 5): ("ratio",), (f, 7): ("ratio",)}
    assert already == 1


def test_a_record_redriven_into_an_upsert_output_is_refused_with_a_trace_not_merged(tmp_path):
    """An old record at a new into time would win over its key's later updates: refused, and
    ``_errors`` says so for each record, at the redrive's into time."""
    import pyarrow as pa

    from reclock.persist.remap import Redrive
    from reclock.runtime.pipeline import Pipeline
    from reclock.sources.base import Output
    from reclock.testing import FakeClock, MemorySource

    kv = pa.schema([("k", pa.int64()), ("v", pa.string())])
    source = MemorySource({"kv": Output("kv", kv, key=("k",), envelope="upsert")})
    source.append("p", "kv", [{"k": 1, "v": "a"}, {"k": None, "v": "lost"}, {"k": 1, "v": "b"}])
    clock = FakeClock(1_000)
    pipeline = Pipeline("u", tmp_path / "lake", source, now=clock)
    pipeline.step()
    out = tmp_path / "lake" / "u" / "outputs"
    [orphan] = read_rows(DeltaLog(out / "_errors").refresh()).to_pylist()
    assert (orphan["kind"], orphan["_offset"]) == ("null_key", 1)

    clock.advance(1_000)
    bindings = pipeline.remap.bindings
    assert pipeline.remap.mint_with_skips(clock.ms, bindings.frontier, [], [Redrive(clock.ms, "p", 0, 2)])
    report = pipeline.step()
    assert report.binding_ts == clock.ms
    assert read_rows(DeltaLog(out / "kv").refresh()).to_pylist() == [{"k": 1, "v": "b", **_lineage(2)}]
    traces = [r for r in read_rows(DeltaLog(out / "_errors").refresh()).to_pylist() if r["_into_ts"] == clock.ms]
    assert sorted((r["kind"], r["_offset"]) for r in traces) == [("not_redriven", 0), ("not_redriven", 1)]
    assert all("output 'kv' is upsert" in r["message"] for r in traces)


def _lineage(offset: int) -> dict:
    return {"_into_ts": 1_000, "_partition": "p", "_offset": offset}


def test_a_record_a_half_committed_batch_landed_with_the_fixed_definition_is_not_redriven_into_it(
    tmp_path, capsys, monkeypatch
):
    """Killed between ``_errors``' commit and ``ratio``'s, then fixed: the replay lands the batch's
    failed records in ``ratio`` with the new definition, beside their ``_errors`` rows. A redrive
    must not land them there a second time."""
    from reclock.job import lifecycle
    from reclock.persist.sink import OutputSink

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.csv").write_text("num,den\n" + "".join(f"{i},{i % 3}\n" for i in range(30)))
    (tmp_path / "p.toml").write_text(ROUTED.format(expression=BROKEN))
    assert main(["create", "p.toml"]) == 0
    commit = OutputSink.commit

    def dies_after_errors(self, files, binding_ts, **kwargs):
        done = commit(self, files, binding_ts, **kwargs)
        if self.path.name == "_errors" and files:
            raise KeyboardInterrupt
        return done

    with monkeypatch.context() as patch:
        patch.setattr(OutputSink, "commit", dies_after_errors)
        with contextlib.suppress(KeyboardInterrupt):
            main(["--lake", "lake", "start", "fractions"])
    lake = tmp_path / "lake"
    failed = {(r["_partition"], r["_offset"]) for r in _rows(lake, "_errors", "fractions")}
    outputs = lake / "fractions" / "outputs"
    labels = {o: label_of(DeltaLog(outputs / o).refresh(), f"reclock/fractions/{o}") for o in ("_errors", "ratio")}
    assert len(failed) == 10 and (labels["ratio"] or 0) < labels["_errors"]  # ratio lacks the batch
    (tmp_path / "p.toml").write_text(ROUTED.format(expression=FIXED))
    assert main(["create", "p.toml", "--replace"]) == 1  # refused now: see the next test
    with monkeypatch.context() as patch:  # as reclock allowed before, so such lakes exist
        patch.setattr(lifecycle, "_refuse_inside_a_batch", lambda lake, name: None)
        assert main(["create", "p.toml", "--replace"]) == 0
    _start_until(  # replays ratio's part
        "fractions",
        lambda: failed <= {(r["_partition"], r["_offset"]) for r in _rows(lake, "ratio", "fractions")},
        "ratio's part of the batch replayed",
    )
    ratio = _rows(lake, "ratio", "fractions")
    assert failed <= {(r["_partition"], r["_offset"]) for r in ratio}

    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "fractions"]) == 0
    assert f"landed nothing; still failing 0, landed before {len(failed)}" in capsys.readouterr().out
    ratio = _rows(lake, "ratio", "fractions")
    assert len({(r["_partition"], r["_offset"]) for r in ratio}) == len(ratio) == 30


def test_a_definition_is_not_replaced_while_a_batch_is_half_committed(tmp_path, capsys, monkeypatch):
    """Its replay would shape the rest of the batch with the new definition: a record the old one
    rejected in an output that holds the batch, and the new one accepts, would land nowhere."""
    from reclock.persist.sink import OutputSink

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.csv").write_text("num,den\n" + "".join(f"{i},{i % 3}\n" for i in range(30)))
    (tmp_path / "p.toml").write_text(IN_PLACE.format(expression=BROKEN))
    assert main(["create", "p.toml"]) == 0
    commit = OutputSink.commit

    def dies_after_rows(self, files, binding_ts, **kwargs):
        done = commit(self, files, binding_ts, **kwargs)
        if self.path.name == "rows" and files:
            raise KeyboardInterrupt  # rows holds the batch without its failures; _errors lacks them
        return done

    with monkeypatch.context() as patch:
        patch.setattr(OutputSink, "commit", dies_after_rows)
        with contextlib.suppress(KeyboardInterrupt):
            main(["--lake", "lake", "start", "fractions"])
    lake = tmp_path / "lake"
    assert len(_rows(lake, "rows", "fractions")) == 20 and not _rows(lake, "_errors", "fractions")
    (tmp_path / "p.toml").write_text(IN_PLACE.format(expression=FIXED))
    capsys.readouterr()
    assert main(["create", "p.toml", "--replace"]) == 1
    err = capsys.readouterr().err
    assert "stopped inside batch" in err and "start it to finish that batch" in err and err.count("\n") == 1

    _start_until(
        "fractions", lambda: len(_rows(lake, "_errors", "fractions")) >= 10, "the half-committed batch finished"
    )
    assert main(["create", "p.toml", "--replace"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "fractions"]) == 0
    assert "landed 10 into rows; still failing 0" in capsys.readouterr().out
    rows = _rows(lake, "rows", "fractions")
    assert len({(r["_partition"], r["_offset"]) for r in rows}) == len(rows) == 30  # nothing lost, once each

"""File states derived from the remap table, the outputs' labels and the listing: never from a log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

from reclock import Bindings, Frontier
from reclock.cli.main import main
from reclock.job.file_states import FileState, FileStatus, derive_file_states, drop_refusal, read_file_states
from reclock.job.lifecycle import file_states
from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.remap import Skip
from reclock.runtime.pipeline import Pipeline
from reclock.sources.files import FilesSource, ListedFile
from reclock.testing import CrashAt, FakeClock, SimulatedCrash
from tests.integration.helpers import files_pipeline_config
from tests.waiting import run_until

COLUMNS = {"id": "int64", "name": "string"}


def listed(path: str, upper: int, generation: int = 0, *, settling: bool = False, ignored: str | None = None):
    return ListedFile(path, generation, upper, settling, ignored)


def by_key(states: list[FileStatus]) -> dict[tuple[str, int], tuple[str, int | None, str | None]]:
    return {(s.path, s.generation): (s.state.value, s.into_ts, s.reason) for s in states}


def bindings(*steps: tuple[int, dict]) -> Bindings:
    b = Bindings()
    for t, offsets in steps:
        b.mint(t, Frontier(offsets))
    return b


def test_loaded_needs_the_output_to_hold_the_binding_and_a_skip_wins():
    b = bindings((1000, {("a.csv", 0): 10}), (2000, {("a.csv", 0): 10, ("b.csv", 0): 20, ("c.parquet", 0): 1}))
    skips = [Skip(2000, ("c.parquet", 0), 0, 1, "ArrowInvalid: not parquet (failed 3 attempts)")]
    listing = [listed("a.csv", 10), listed("b.csv", 20), listed("c.parquet", 1), listed("d.csv", 7)]
    states = by_key(derive_file_states(b, skips, 1001, listing))
    assert states == {
        ("a.csv", 0): ("Loaded", 1000, None),
        ("b.csv", 0): ("Unloaded", 2000, "bound in a batch that is not in the output yet"),
        ("c.parquet", 0): ("Skipped", 2000, "ArrowInvalid: not parquet (failed 3 attempts)"),
        ("d.csv", 0): ("Unloaded", None, "not in a batch yet"),
    }
    assert by_key(derive_file_states(b, skips, 2001, listing))[("b.csv", 0)] == ("Loaded", 2000, None)
    assert by_key(derive_file_states(b, skips, 0, listing))[("a.csv", 0)][0] == "Unloaded"


def test_ignored_and_settling_files_are_listed_with_their_reason():
    listing = [
        listed("dangling.csv", 0, ignored="dangling link"),
        listed("pipe.csv", 0, ignored="not a regular file (fifo)"),
        listed("empty.csv", 0, ignored="empty file"),
        listed("fresh.csv", 9, settling=True),
    ]
    assert by_key(derive_file_states(Bindings(), [], 0, listing)) == {
        ("dangling.csv", 0): ("Ignored", None, "dangling link"),
        ("pipe.csv", 0): ("Ignored", None, "not a regular file (fifo)"),
        ("empty.csv", 0): ("Ignored", None, "empty file"),
        ("fresh.csv", 0): ("Unloaded", None, "settling: modified less than settle_seconds ago"),
    }


def test_bound_files_keep_their_state_and_say_what_changed_since():
    b = bindings((1000, {("gone.csv", 0): 5, ("grew.csv", 0): 5, ("old.csv", 0): 5, ("link.csv", 0): 5}))
    listing = [listed("grew.csv", 9), listed("old.csv", 5, generation=1)]
    listing.append(listed("link.csv", 0, ignored="dangling link"))
    assert by_key(derive_file_states(b, [], 1001, listing)) == {
        ("old.csv", 1): ("Unloaded", None, "not in a batch yet"),
        ("gone.csv", 0): ("Loaded", 1000, "no longer listed"),
        ("grew.csv", 0): ("Loaded", 1000, "changed after it was bound (upper now 9): drop it to read it again"),
        ("link.csv", 0): ("Loaded", 1000, "now ignored: dangling link"),
        ("old.csv", 0): ("Loaded", 1000, "dropped: generation 1 replaces it"),
    }
    # Without a listing only what is bound is known, and nothing is said about the directory.
    assert by_key(derive_file_states(b, [], 1001, None))[("gone.csv", 0)] == ("Loaded", 1000, None)


def test_newest_first_unbound_files_on_top():
    b = bindings((1000, {("x.csv", 0): 1}), (2000, {("x.csv", 0): 1, ("a.csv", 0): 1}))
    listing = [listed("x.csv", 1), listed("a.csv", 1), listed("n.csv", 1), listed("m.csv", 1)]
    assert [s.path for s in derive_file_states(b, [], 2001, listing)] == ["m.csv", "n.csv", "a.csv", "x.csv"]


@pytest.mark.parametrize(
    ("path", "generation", "why"),
    [
        ("loaded.csv", 0, None),
        ("skipped.csv", 0, None),
        ("unknown.csv", 0, "is not a file it has seen"),
        ("new.csv", 0, "has not loaded it yet"),
        ("inflight.csv", 0, "is in a batch that is not in the output yet; drop it once it is Loaded"),
        ("loaded.csv", 1, "is dropped already: generation 1 is not loaded yet"),
        ("dangling.csv", 0, "is ignored (dangling link)"),
    ],
)
def test_only_a_loaded_or_skipped_current_generation_can_be_dropped(path, generation, why):
    done = {("loaded.csv", 0): 3, ("skipped.csv", 0): 1}
    b = bindings((1000, done), (2000, {**done, ("inflight.csv", 0): 4}))
    skips = [Skip(1000, ("skipped.csv", 0), 0, 1, "corrupt")]
    listing = [listed("new.csv", 2), listed("dangling.csv", 0, ignored="dangling link")]
    if generation:
        listing.append(listed(path, 3, generation=generation))
    assert drop_refusal(derive_file_states(b, skips, 1001, listing), path, generation) == why


def output_files(lake: Path) -> set[str]:
    table = DeltaTable(str(Lake.at(lake).output_path("pipe", "rows")))
    return {p for p in read_table(table, columns=["_partition"]).column("_partition").to_pylist()}


@pytest.mark.parametrize("step", ["minted", "written", "committed:_errors", "committed:rows", "resumed"])
def test_a_crash_at_any_step_leaves_loaded_exactly_the_files_whose_rows_are_in_the_output(tmp_path, step):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,name\n1,x\n2,y\n")
    (folder / "b.csv").write_text("id,name\n3,z\nbad,w\n")
    lake = tmp_path / "lake"
    source = FilesSource(path=folder, columns=COLUMNS)
    with pytest.raises(SimulatedCrash):
        Pipeline("pipe", lake, source, now=FakeClock(1000), on_step=CrashAt(step)).step()
    states = read_file_states(Lake.at(lake), "pipe", FilesSource(path=folder, columns=COLUMNS))
    loaded = {s.path for s in states if s.state is FileState.LOADED}
    in_output = {p.split('"')[1] for p in output_files(lake)}
    assert loaded == in_output
    assert loaded == ({"a.csv", "b.csv"} if step.startswith("committed") or step == "resumed" else set())


def files_pipeline(tmp_path: Path, folder: Path, **source: object) -> Path:
    knobs = {"max_retries": 0, "retry_backoff": 0.0, "batch_interval": 0.05, "stop_on_error": False}
    return files_pipeline_config(tmp_path / "files.toml", folder, pipeline=knobs, source=source)


def test_reclock_files_shows_every_file_and_drop_file_refuses_what_is_not_loaded_in_one_line(tmp_path, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,name\n1,x\n")
    (folder / "broken.parquet").write_bytes(b"PAR1 not parquet")
    (folder / "empty.csv").write_text("")
    (folder / "dangling.csv").symlink_to(folder / "missing.csv")
    os.mkfifo(folder / "pipe.csv")
    (tmp_path / "outside.csv").write_text("id,name\n2,y\n")
    (folder / "out.csv").symlink_to(tmp_path / "outside.csv")
    assert main(["create", str(files_pipeline(tmp_path, folder))]) == 0
    lake = str(tmp_path / "lake")
    capsys.readouterr()
    assert main(["--lake", lake, "files", "ingest"]) == 0  # before any start: all listed, nothing created
    table = [line.split(None, 4) for line in capsys.readouterr().out.splitlines()]
    assert table[0] == ["path", "generation", "size", "state", "into_ts  reason"]
    assert ["a.csv", "0", "12", "Unloaded", "not in a batch yet"] in table
    assert not (tmp_path / "lake" / "ingest" / "remap").exists()

    def sorted_out() -> bool:  # the files source never finishes: run it until it has seen them
        states = {f.path: f.state for f in file_states(Lake.at(lake), "ingest")}
        return states.get("a.csv") == FileState.LOADED and states.get("broken.parquet") == FileState.SKIPPED

    run_until(Lake.at(lake), "ingest", sorted_out, "a.csv Loaded and broken.parquet Skipped")
    capsys.readouterr()
    assert main(["--lake", lake, "files", "ingest", "--json"]) == 0
    states = {r["path"]: (r["state"], r["reason"]) for r in json.loads(capsys.readouterr().out)}
    assert states["broken.parquet"][0] == "Skipped" and "Parquet magic bytes" in states["broken.parquet"][1]
    assert {path: state for path, state in states.items() if path != "broken.parquet"} == {
        "a.csv": ("Loaded", None),
        "empty.csv": ("Ignored", "empty file"),
        "dangling.csv": ("Ignored", "dangling link"),
        "pipe.csv": ("Ignored", "not a regular file (fifo)"),
        "out.csv": ("Ignored", "link outside the source directory"),
    }
    for path, why in [
        ("pipe.csv", "it is ignored (not a regular file (fifo))"),
        ("nope.csv", "it is not a file it has seen"),
    ]:
        assert main(["--lake", lake, "drop-file", "ingest", path]) == 2
        said = f"reclock: config error: path: pipeline 'ingest' cannot drop {path!r}: {why} (see reclock files)\n"
        assert capsys.readouterr().err == said
    assert main(["--lake", lake, "drop-file", "ingest", "broken.parquet"]) == 0
    assert main(["--lake", lake, "drop-file", "ingest", "a.csv"]) == 0
    assert main(["--lake", lake, "drop-file", "ingest", "a.csv"]) == 2
    assert "it is dropped already: generation 1 is not loaded yet" in capsys.readouterr().err


def test_follow_links_outside_must_be_a_boolean_named_in_one_line(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    assert main(["create", str(files_pipeline(tmp_path, tmp_path / "in", follow_links_outside="yes"))]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith("source.follow_links_outside: must be true or false, got 'yes'")

"""A plugin source declares file states through the capability, and the job treats its files as it
treats the built-in files source's: ``reclock files`` lists them, ``drop-file`` loads one again,
the ``files`` status table records them, and a job restores the rows a killed one never wrote.

The plugin is ``tests/plugins/notefiles``: a plain class (no ``SourceBase``) that declares
``FileStates`` and ``TakesContext``; nothing in reclock names it. Every expectation is what the
test wrote into the notes, and the output rows are read from the Delta log by an outside reader.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from reclock.cli.main import main
from reclock.job.control import load
from reclock.job.lifecycle import source_of
from reclock.persist.lake import Lake
from reclock.persist.status_tables import read_status_table
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from tests.delta_log import replay
from tests.docs_blocks import ROOT, blocks
from tests.waiting import run_until

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "notefiles"
KIND = "notefiles.source:NoteFilesSource"

#: What the test writes: every note's complete lines (``b.txt`` also has a line still being written).
NOTES = {"a.txt": ["alpha", "beta", "gamma"], "b.txt": ["one", "two"]}


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """The plugin's folder on ``sys.path``, as ``PYTHONPATH`` would put it."""
    monkeypatch.syspath_prepend(str(PLUGIN))


def write_notes(folder: Path) -> None:
    folder.mkdir()
    (folder / "a.txt").write_text("".join(f"{line}\n" for line in NOTES["a.txt"]))
    (folder / "b.txt").write_text("".join(f"{line}\n" for line in NOTES["b.txt"]) + "still being writ")
    (folder / "empty.txt").write_text("no newline yet")
    (folder / "README.md").write_text("not a note\n")


def create(tmp_path: Path, folder: Path, pipeline: str = "") -> str:
    definition = tmp_path / "notes.toml"
    definition.write_text(
        f'[pipeline]\nname = "notes"\nlake = "lake"\nengine = "local"\nbatch_interval = 0.05\n{pipeline}\n'
        f'[source]\nkind = "{KIND}"\npath = "{folder}"\n'
    )
    assert main(["create", str(definition)]) == 0
    return str(tmp_path / "lake")


def reclock_files(lake: str, capsys) -> dict[tuple[str, int], dict]:
    capsys.readouterr()
    assert main(["--lake", lake, "files", "notes", "--json"]) == 0
    return {(r["path"], r["generation"]): r for r in json.loads(capsys.readouterr().out)}


def output_rows(lake: str) -> dict[str, list[tuple[int, str, int]]]:
    """Per encoded partition, ``(offset, line, into time)`` of every row of the ``notes`` output."""
    rows = defaultdict(list)
    for row in replay(Lake.at(lake).output_path("notes", "notes")).rows():
        rows[row["_partition"]].append((row["_offset"], row["line"], row["_into_ts"]))
    return {partition: sorted(found) for partition, found in rows.items()}


def start_until_recorded(lake: str, *files: tuple[str, int]) -> None:
    """``reclock start notes`` until its files status table holds each of ``files`` (path,
    generation) Loaded, then stopped: the source never finishes, and a loaded machine lands less
    in a given second."""

    def recorded() -> bool:
        rows = read_status_table(Lake.at(lake), "files", "notes").to_pylist()
        return set(files) <= {(r["path"], r["generation"]) for r in rows if r["state"] == "Loaded"}

    run_until(Lake.at(lake), "notes", recorded, f"the job to record {files} Loaded")


def test_reclock_files_lists_a_plugins_files_and_drop_file_loads_one_again(tmp_path, capsys):
    folder = tmp_path / "notes"
    write_notes(folder)
    lake = create(tmp_path, folder)
    states = reclock_files(lake, capsys)
    assert {key: (r["state"], r["size"], r["reason"]) for key, r in states.items()} == {
        ("a.txt", 0): ("Unloaded", 3, "not in a batch yet"),
        ("b.txt", 0): ("Unloaded", 2, "not in a batch yet"),
        ("empty.txt", 0): ("Ignored", 0, "no complete line"),
        ("README.md", 0): ("Ignored", 0, "not a .txt note"),
    }

    start_until_recorded(lake, ("a.txt", 0), ("b.txt", 0))
    rows = output_rows(lake)
    for name, lines in NOTES.items():
        assert [(o, line) for o, line, _ in rows[f'["{name}",0]']] == list(enumerate(lines))
    into = {name: {t for _, _, t in rows[f'["{name}",0]']} for name in NOTES}
    states = reclock_files(lake, capsys)
    for name, lines in NOTES.items():
        assert (states[(name, 0)]["state"], states[(name, 0)]["size"]) == ("Loaded", len(lines))
        assert {states[(name, 0)]["into_ts"]} == into[name]  # the rows' own into time
    recorded = read_status_table(Lake.at(lake), "files", "notes").to_pylist()
    assert sorted((r["path"], r["generation"], r["size"], r["state"]) for r in recorded) == [
        ("a.txt", 0, 3, "Loaded"),
        ("b.txt", 0, 2, "Loaded"),
    ]

    assert main(["--lake", lake, "drop-file", "notes", "a.txt"]) == 0
    states = reclock_files(lake, capsys)
    assert (states[("a.txt", 1)]["state"], states[("a.txt", 1)]["reason"]) == ("Unloaded", "not in a batch yet")
    assert states[("a.txt", 0)]["reason"] == "dropped: generation 1 replaces it"
    start_until_recorded(lake, ("a.txt", 1))
    rows = output_rows(lake)
    assert [(o, line) for o, line, _ in rows['["a.txt",1]']] == list(enumerate(NOTES["a.txt"]))
    assert len(rows['["a.txt",0]']) == 3 and len(rows['["b.txt",0]']) == 2  # the first loads stay, once
    assert reclock_files(lake, capsys)[("a.txt", 1)]["state"] == "Loaded"


def test_a_job_restores_the_files_rows_of_a_batch_no_job_recorded(tmp_path):
    folder = tmp_path / "notes"
    write_notes(folder)
    lake = create(tmp_path, folder)
    config, created_at = load(Lake.at(lake), "notes")
    source = source_of(Lake.at(lake), "notes", config, created_at)  # what a killed job had committed
    Pipeline("notes", lake, source, data_plane=LocalDataPlane()).step()
    assert read_status_table(Lake.at(lake), "files", "notes").num_rows == 0
    start_until_recorded(lake, ("a.txt", 0), ("b.txt", 0))
    into = {t for _, _, t in output_rows(lake)['["a.txt",0]']}
    recorded = read_status_table(Lake.at(lake), "files", "notes").to_pylist()
    assert {(r["path"], r["generation"], r["size"], r["state"], r["batch_id"]) for r in recorded} == {
        ("a.txt", 0, 3, "Loaded", *into),
        ("b.txt", 0, 2, "Loaded", *into),
    }


def test_the_guides_file_states_plugin_is_the_tested_plugin():
    guide = {b.arg: b.text for b in blocks(ROOT / "docs" / "source-authors.md") if b.kind == "plugin"}
    assert guide["notefiles/source.py"] == (PLUGIN / "notefiles" / "source.py").read_text()

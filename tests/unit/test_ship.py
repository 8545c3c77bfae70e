"""What a driver ships to Spark executors: reclock and the source's package, as it imports them.

No Spark here: the archive is checked by importing from it in a fresh interpreter that has the
dependencies but not the checkout (``-S``: no ``.pth`` file puts reclock on its path).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from reclock.job.spark import code_archive, runs_elsewhere, shipped_packages
from reclock.sources.generator import GeneratorSource

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "sensorlog"


def test_the_archive_holds_reclock_through_its_symlinked_folders_without_compiled_files(tmp_path):
    names = zipfile.ZipFile(code_archive(["reclock"], tmp_path / "code.zip")).namelist()
    assert {"reclock/__init__.py", "reclock/sources/kafka/source.py", "reclock/persist/remap.py"} <= set(names)
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]


@pytest.mark.usefixtures("reclock_processes")
def test_a_fresh_interpreter_imports_reclock_and_the_plugin_from_the_archive(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    archive = code_archive(["reclock", "sensorlog"], tmp_path / "code.zip")
    code = (
        f"import sys; sys.path[:0] = [{str(archive)!r}]; sys.path.append({sysconfig.get_paths()['purelib']!r})\n"
        "import reclock.sources.generator, sensorlog.source\n"
        "print(reclock.__file__, sensorlog.source.__file__)"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{archive}/reclock/__init__.py", f"{archive}/sensorlog/source.py"]


def test_a_single_module_is_shipped_as_one_file_and_an_unimportable_name_is_refused(tmp_path, monkeypatch):
    (tmp_path / "solo.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert zipfile.ZipFile(code_archive(["solo"], tmp_path / "code.zip")).namelist() == ["solo.py"]
    with pytest.raises(ModuleNotFoundError, match="cannot ship 'no_such_thing' to the executors"):
        code_archive(["no_such_thing"], tmp_path / "other.zip")


def test_the_source_package_is_shipped_beside_reclock_unless_it_is_reclock(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    from sensorlog.source import SensorLogSource

    assert shipped_packages(GeneratorSource(limit=10)) == ["reclock"]
    assert shipped_packages(SensorLogSource(str(tmp_path))) == ["reclock", "sensorlog"]


@pytest.mark.parametrize(
    ("master", "elsewhere"),
    [
        ("local", False),
        ("local[2]", False),
        ("local[*]", False),
        ("local-cluster[2,1,1024]", True),
        ("spark://10.0.0.1:7077", True),
        ("yarn", True),
        ("k8s://https://api:6443", True),
    ],
)
def test_code_is_shipped_only_when_executors_are_other_processes(master, elsewhere):
    assert runs_elsewhere(master) is elsewhere


@pytest.mark.usefixtures("reclock_processes")
def test_the_spark_submit_entry_runs_the_cli_with_its_own_folder_off_the_path(tmp_path):
    entry = Path(__file__).resolve().parents[2] / "reclock" / "cli" / "submit.py"
    code = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(entry.parent)!r}); sys.argv = [{str(entry)!r}, '--lake', 'lake', 'status']\n"
        "try:\n"
        f"    runpy.run_path({str(entry)!r}, run_name='__main__')\n"
        "finally:\n"
        f"    print({str(entry.parent)!r} in sys.path)\n"
    )
    (tmp_path / "lake").mkdir()  # an empty lake: one that does not exist is a mistake (exit 2)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"no pipelines in {tmp_path / 'lake'}", "False"]

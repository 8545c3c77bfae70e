"""Package boundaries the design promises to source authors and acceptance tests."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.usefixtures("reclock_processes")
def test_importing_reclock_loads_no_spark_delta_or_kafka():
    code = (
        "import sys, reclock\n"
        "from reclock import Frontier, Bindings\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'deltalake', 'kafka', 'py4j'))\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_public_core_api_is_exported():
    import reclock

    for name in ("Frontier", "Bindings", "ConfigError", "DefiniteSourceError", "FencedError", "ReclockError"):
        assert name in reclock.__all__ and hasattr(reclock, name)


@pytest.mark.usefixtures("reclock_processes")
def test_the_public_surface_is_importable_from_reclock_and_loads_only_on_use():
    code = (
        "import sys, reclock\n"
        "assert 'deltalake' not in sys.modules\n"
        "from reclock import Pipeline, Settings, Maintenance, Source, SourceBase, Output, Split, error_batch\n"
        "from reclock import read_as_of, read_as_of_spark, readable_upper, Lake, LocalDataPlane, BatchReport\n"
        "assert Pipeline.__module__ == 'reclock.runtime.pipeline' and callable(read_as_of)\n"
        "assert all(hasattr(reclock, name) for name in reclock.__all__)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
    import reclock

    with pytest.raises(AttributeError, match="no attribute 'Pipelin'"):
        reclock.Pipelin  # noqa: B018 - a typo gets the usual AttributeError


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["sources", "persist"])
def test_a_top_level_folder_imported_by_its_folder_name_fails_loudly(folder):
    """From the checkout's root ``sources`` and ``persist`` are importable by path; a second copy of
    every class under another name would make ``isinstance`` and ``except`` silently miss, so the
    import fails and names the package to import instead."""
    done = subprocess.run([sys.executable, "-c", f"import {folder}.base"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert f"ImportError: import reclock.{folder}, not {folder}" in done.stderr


def test_the_package_names_of_sources_and_persist_still_import_from_the_checkout_root():
    code = "import reclock.sources.base, reclock.persist.lake; print(reclock.sources.base.Split.__module__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "reclock.sources.base", done.stderr


def test_no_module_names_a_folder_instead_of_its_package():
    """Docstring references (``:mod:`sources.files.listing```) and imports name the package, so a
    reader can paste them into Python."""
    pattern = re.compile(
        r"(?<![\w./-])(?:sources|persist)\.(?:base|decode|files|kafka|generator|pyspark_in"
        r"|asof|remap|sink|lake|store|read|layout|lease|conditional|evolution|faults|maintenance"
        r"|spark_files|status_tables|windows)\b"
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for top in ("reclock", "sources", "persist")
        for path in (ROOT / top).rglob("*.py")
        if "reclock/sources" not in path.as_posix() and "reclock/persist" not in path.as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []

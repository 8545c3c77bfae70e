"""The wheel installs one top-level package, ``reclock``: no generic ``sources`` or ``persist``.

Built from this checkout by pip (the two symlinks ``reclock/sources`` and ``reclock/persist``
become real folders in the wheel) and installed without dependencies into a fresh virtual
environment, whose site-packages is then compared with what a fresh environment holds anyway.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.usefixtures("reclock_processes")]  # pip, and a Python importing the wheel

ROOT = Path(__file__).resolve().parents[2]


def _site_packages(env: Path) -> Path:
    return next(env.glob("lib/python3*/site-packages"))


def test_pip_install_puts_only_reclock_at_the_top_level(tmp_path):
    wheels = tmp_path / "wheels"
    leftover = not (ROOT / "build").exists()
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if leftover:  # pip builds in the checkout's build/: leave the tree as it was
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("reclock-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"reclock", wheel.name.split("-py")[0] + ".dist-info"}
    assert "reclock/sources/kafka/source.py" in names and "reclock/persist/remap.py" in names
    # The status page works offline: its page, script, style and chart library ship in the wheel.
    static = {"index.html", "app.js", "app.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE.txt"}
    assert {f"reclock/ui/static/{name}" for name in static} <= set(names)

    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    before = {p.name for p in _site_packages(env).iterdir()}
    python = env / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the checkout's egg-info must not count
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    added = {p.name for p in _site_packages(env).iterdir()} - before
    assert {name for name in added if not name.endswith(".dist-info")} == {"reclock"}
    # the dependencies come from this environment's site-packages (numpy, pyarrow, deltalake ...)
    dependencies = next(p for p in sys.path if p.endswith("site-packages"))
    code = "import reclock, reclock.sources.generator, reclock.persist.remap; print(reclock.__file__)"
    probe = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": dependencies}
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(_site_packages(env)))

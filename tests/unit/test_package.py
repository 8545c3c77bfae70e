"""Package boundaries the design promises to source authors and acceptance tests."""

from __future__ import annotations

import subprocess
import sys

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

"""Package boundaries the design promises to source authors and acceptance tests."""

from __future__ import annotations

import subprocess
import sys


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

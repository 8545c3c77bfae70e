"""Project-wide test settings: deterministic hypothesis runs without wall-clock deadlines.

These machines are noisy (first calls into Arrow compute or Delta take hundreds of ms), so a
deadline would make property tests flaky without pinning any behaviour. ``CI=true`` runs more
examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")

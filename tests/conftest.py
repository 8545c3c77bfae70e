"""Project-wide test settings: deterministic hypothesis runs without wall-clock deadlines.

These machines are noisy (first calls into Arrow compute or Delta take hundreds of ms), so a
deadline would make property tests flaky without pinning any behaviour. CI runs the same number
of examples as a developer, so the unit suite stays under a minute everywhere.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("reclock", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("reclock")

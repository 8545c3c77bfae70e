"""Shaping and routing: per-output transforms between decode and the sink, with an error port.

:mod:`.definition` says what a shaped output is and checks it on the driver, :mod:`.engine` runs
SQL (DataFusion), :mod:`.apply` runs a route's transform over a batch in a task. The guide is
``docs/shaping.md``.
"""

from reclock.runtime.shaping.apply import TRANSFORM_ERROR, Outcome, apply_route, shape_batch
from reclock.runtime.shaping.definition import (
    Route,
    Shape,
    Transform,
    route_outputs,
    shapes_from_toml,
    shapes_to_toml,
)

__all__ = [
    "TRANSFORM_ERROR",
    "Outcome",
    "Route",
    "Shape",
    "Transform",
    "apply_route",
    "route_outputs",
    "shape_batch",
    "shapes_from_toml",
    "shapes_to_toml",
]

"""What a pipeline's driver owns: the one place its stages find the source, the tables and the hooks.

:class:`~reclock.runtime.pipeline.Pipeline` builds one :class:`Driver` and hands it to every stage
of a batch (:mod:`reclock.runtime.batch`) and to its loop: the source and the data plane, the
remap table, the outputs with their sinks, routes, layouts and windows, what the definition
awaits for outputs not born yet, the landing ahead (:mod:`reclock.runtime.ahead`), and the hooks
(``now``, ``fence`` before every durable write, ``on_step`` after every step a test may crash
at). The remap table and the sinks are the only owners of durable state; the driver holds them,
and derives from them what every stage asks (the resume upper and frontier).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from reclock.persist.lake import Lake, sink_id
from reclock.persist.layout import OutputLayout
from reclock.persist.remap import RemapTable
from reclock.persist.sink import OutputSink, table_schema
from reclock.runtime.ahead import Landings
from reclock.runtime.planes import DataPlane
from reclock.runtime.settings import Settings
from reclock.runtime.shaping import Route, Shape
from reclock.runtime.windowing import Windows
from reclock.runtime.windows import Window
from reclock.sources.base import Output, Source
from reclock.timeline.frontier import Frontier, IntoTime
from reclock.timeline.resume import is_finished, resume_frontier, resume_upper

__all__ = ["Awaited", "Driver", "make_sink"]


def make_sink(lake: Lake, pipeline: str, output: Output, layout: OutputLayout | None) -> OutputSink:
    """The sink of ``pipeline``'s ``output``, its table created if there is none (or found, after a crash)."""
    return OutputSink(
        lake.output_path(pipeline, output.name),
        sink_id(pipeline, output.name),
        table_schema(output.schema, layout=layout),
        envelope=output.envelope,
        key=output.key,
        store=lake.store,
        layout=layout,
    )


@dataclass
class Awaited:
    """What the definition says of outputs that may join the source later, applied at their
    birth (:mod:`reclock.runtime.outputs`): their shapes, their layouts, the windows over them."""

    shapes: tuple[Shape, ...] = ()
    layouts: dict[str, OutputLayout] = field(default_factory=dict)
    windows: tuple[Window, ...] = ()


@dataclass(eq=False)
class Driver:
    """One pipeline's owners, shared by its stages (module docstring). The mappings grow when an
    output is born (:mod:`reclock.runtime.births`) and are otherwise fixed for the driver's life."""

    name: str
    lake: Lake
    source: Source
    plane: DataPlane
    settings: Settings
    remap: RemapTable
    outputs: dict[str, Output]
    routes: dict[str, tuple[Route, ...]]
    layouts: dict[str, OutputLayout]
    sinks: dict[str, OutputSink]
    windows: Windows
    awaited: Awaited
    landings: Landings
    now: Callable[[], int]
    fence: Callable[[], None]
    on_step: Callable[[str], None]

    def sink(self, output: Output) -> OutputSink:
        """The sink of ``output``, its table created if there is none (or found, after a crash)."""
        return make_sink(self.lake, self.name, output, self.layouts.get(output.name))

    @property
    def resume_upper(self) -> IntoTime:
        """The slowest output's upper: everything below it is durable in every output."""
        return resume_upper(sink.upper for sink in self.sinks.values())

    def resume_frontier(self) -> Frontier:
        """``R(resume_upper - 1)``, from the bindings the outputs hold only: no lake I/O."""
        return resume_frontier(self.remap.held_bindings, self.resume_upper)

    @property
    def finished(self) -> bool:
        """The source is closed and every output holds its closing binding (no lake I/O)."""
        return is_finished(self.remap.held_bindings, self.resume_upper)

    @property
    def pending(self) -> bool:
        """Some binding is durable but not yet in every output."""
        return self.resume_upper < self.remap.bindings.upper

    def uppers(self) -> dict[str, IntoTime]:
        """Every output's upper, by name."""
        return {name: sink.upper for name, sink in self.sinks.items()}

    def resync(self) -> None:
        """Re-read what is durable (the remap table, every output): another writer moved them."""
        self.remap.sync()
        for sink in self.sinks.values():
            sink.refresh()

"""Births: outputs a source gained while running, each born at the binding that first holds it.

Part of the plan stage (:mod:`reclock.runtime.plan`): called when a pipeline is built and before
every batch is planned, so an output is born before any batch reaching its binding runs. A
:class:`~reclock.sources.base.GrowsOutputs` source names each output it gained with a partition;
the output is born at the binding ``T`` that first holds offset 0 of it.
"""

from __future__ import annotations

import logging

from reclock.errors import ConfigError, DefiniteSourceError
from reclock.persist.layout import OutputLayout, output_layouts
from reclock.runtime.driver import Driver
from reclock.runtime.outputs import joined_output
from reclock.runtime.shaping import Route, route_outputs
from reclock.runtime.windows import Window, check_windows
from reclock.sources.base import GrowsOutputs, Output

__all__ = ["born_outputs"]

log = logging.getLogger("reclock.pipeline")


def born_outputs(driver: Driver) -> None:
    """Give every output the source gained and the remap table binds its sink and windows.

    Step 1: what the definition awaited for it (its shaping and routes, the layouts of the outputs
    they make, the windows over them), checked against its columns as ``create`` checks a declared
    output's: a definition that cannot apply is a definite error naming its field, before anything
    of the output is written, so a corrected definition applies at the next start. Step 2: the
    sinks and their tables. Step 3: an empty commit labelled ``T - 1``, so each new output's upper
    is ``T``: the resume frontier (the least upper) is not dragged back to the start, and a read as
    of a time before ``T`` finds the output empty. Step 4: its windows, closed from then on. A crash
    between steps 2 and 3 leaves a table at upper 0 that the next call finishes (until then the
    readable upper is 0: nothing wrong is readable). A source that has not bound the partition yet
    has an output that is not born yet: nothing happens.
    """
    if not isinstance(driver.source, GrowsOutputs):
        return
    bindings = driver.remap.bindings
    for joined in driver.source.joined_outputs():
        if joined.output.name in driver.sinks:
            continue
        born = bindings.reclock(joined.partition, 0)
        if born is None:
            continue
        # Step 1: the outputs it makes, shaped and routed, with their layouts and windows.
        outputs, routes, layouts, windows = _awaited(driver, joined_output(joined.output, driver.outputs))
        driver.layouts.update(layouts)
        for output in outputs.values():
            # Step 2: the sink, its table created (or found, after a crash).
            sink = driver.sink(output)
            # Step 3: its upper at the birth, by one empty labelled commit.
            if sink.upper < born:
                driver.fence()
                sink.commit([], born - 1, planned_upper=sink.upper)
            driver.outputs[output.name] = output
            driver.sinks[output.name] = sink
            log.info("pipeline %s: output %s joined, born at %d", driver.name, output.name, born)
        driver.routes.update(routes)
        # Step 4: its windows, closed from now on like every other.
        driver.windows.add(windows, driver.outputs)
        driver.awaited.windows = tuple(w for w in driver.awaited.windows if w not in windows)
        driver.on_step(f"born:{joined.output.name}")


def _awaited(
    driver: Driver, output: Output
) -> tuple[dict[str, Output], dict[str, tuple[Route, ...]], dict[str, OutputLayout], list[Window]]:
    """A joined ``output`` with what the definition awaited for it: the outputs it lands in
    (itself, shaped or not, and those its routes make), its routes, their layouts, and the
    windows over them (and ``from`` those), checked as ``create`` checks a declared output's."""
    awaited = driver.awaited
    shapes = [shape for shape in awaited.shapes if shape.source_output == output.name]
    try:
        outputs, routes = route_outputs({output.name: output}, shapes)
        taken = [name for name in outputs if name in driver.outputs]
        if taken:
            raise ConfigError(f"outputs.{taken[0]}", "is an output already")
        layouts = {name: awaited.layouts[name] for name in outputs if name in awaited.layouts}
        output_layouts(outputs, layouts)
        windows: list[Window] = []
        for window in awaited.windows:
            if window.output in outputs or window.from_window in {w.name for w in windows}:
                windows.append(window)
        check_windows([*driver.windows.defined, *windows], [*driver.outputs.values(), *outputs.values()])
    except ConfigError as exc:
        raise DefiniteSourceError(
            f"{exc} (output {output.name!r} joined the source; correct the definition: reclock create --replace)"
        ) from None
    return outputs, routes, layouts, windows

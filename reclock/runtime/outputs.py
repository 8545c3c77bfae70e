"""The outputs a pipeline writes: the source's, checked once, and ``_errors`` added by the runtime;
later, those a :class:`~reclock.sources.base.GrowsOutputs` source gains while it runs (:func:`joined_output`).

Checked when a pipeline is built, so a source that declares a bad output fails at ``create`` with
one line naming it, never halfway through a batch; so are their layouts (``[outputs.<name>]``).

What a definition says of an output that does not exist yet is *awaited*: accepted only for a
source that says an output of that name may join (:class:`~reclock.sources.base.AwaitsOutputs`),
kept aside (:func:`awaited_shapes`, the second value of :func:`layouts_of`, :func:`awaited_windows`),
and applied when the output is born, checked then against its columns exactly as it would have
been at ``create``.
Any other unknown name is refused at ``create``, one line naming ``outputs.<name>``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from reclock.envelope import APPEND, ENVELOPES
from reclock.errors import ConfigError
from reclock.persist.lake import NAME_PATTERN
from reclock.persist.layout import OutputLayout, output_layouts
from reclock.runtime.shaping import Shape
from reclock.runtime.windows import Window
from reclock.sources.base import ERRORS, ERRORS_SCHEMA, AwaitsOutputs, KeepsUnknownFields, Output, Source

__all__ = ["awaited_shapes", "awaited_windows", "check_layouts", "joined_output", "layouts_of", "outputs_of"]


def outputs_of(source: Source) -> dict[str, Output]:
    outputs: dict[str, Output] = {}
    for output in source.outputs():
        _check(output, outputs)
        outputs[output.name] = output
    outputs[ERRORS] = Output(ERRORS, ERRORS_SCHEMA)
    return outputs


def joined_output(output: Output, outputs: Mapping[str, Output]) -> Output:
    """An output a :class:`~reclock.sources.base.GrowsOutputs` source gained while running, checked
    like the others against those the pipeline has (a bug in the source if it fails: the
    pipeline stops with the line naming it, as at ``create``)."""
    _check(output, outputs)
    return output


def _check(output: Output, outputs: Mapping[str, Output]) -> None:
    if not NAME_PATTERN.match(output.name) or output.name.startswith("_"):
        raise ConfigError("outputs", f"output name {output.name!r} must be an identifier not starting with '_'")
    if output.name in outputs:
        raise ConfigError("outputs", f"output {output.name!r} is declared twice")
    if output.envelope not in ENVELOPES:
        raise ConfigError("outputs", f"output {output.name!r}: unknown envelope {output.envelope!r}")
    if output.envelope != APPEND and not output.key:
        raise ConfigError("outputs", f"output {output.name!r}: a {output.envelope} output needs key columns")
    missing = [k for k in output.key if k not in output.schema.names]
    if missing:
        raise ConfigError("outputs", f"output {output.name!r}: key columns {missing} are not in its schema")


def awaited_shapes(
    source: Source, outputs: Collection[str], shapes: Sequence[Shape]
) -> tuple[tuple[Shape, ...], tuple[Shape, ...]]:
    """``shapes`` split into those of outputs the source has (resolved now) and those of an output
    that may join it later (resolved at its birth); a shape of any other name stays with the
    first, so that :func:`~reclock.runtime.shaping.route_outputs` refuses it naming its field."""
    later = tuple(shape for shape in shapes if _may_join(source, outputs, shape.source_output))
    return tuple(shape for shape in shapes if shape not in later), later


def awaited_windows(
    source: Source, outputs: Collection[str], windows: Sequence[Window], later: Sequence[Shape] = ()
) -> tuple[tuple[Window, ...], tuple[Window, ...]]:
    """``windows`` split into those over outputs the pipeline has (closed from the start) and
    those awaited: over an output that may join the source, or that a shape of ``later``
    (:func:`awaited_shapes`) makes when its input joins, or ``from`` such a window; they are
    checked and closed once it is born. A window over any other name stays with the first, so
    that :func:`~reclock.runtime.windows.check_windows` refuses it naming its field."""
    shaped_later = {shape.name for shape in later}
    waiting: set[str] = set()
    for window in windows:
        if window.from_window is not None:
            waits = window.from_window in waiting
        else:
            waits = window.output in shaped_later or _may_join(source, outputs, window.output)  # type: ignore[arg-type]
        if waits:
            waiting.add(window.name)
    return (
        tuple(w for w in windows if w.name not in waiting),
        tuple(w for w in windows if w.name in waiting),
    )


def _may_join(source: Source, outputs: Collection[str], name: str) -> bool:
    return (
        isinstance(source, AwaitsOutputs)
        and name not in outputs
        and isinstance(name, str)
        and not name.startswith("_")
        and source.may_join(name)
    )


def layouts_of(
    source: Source,
    outputs: Mapping[str, Output],
    layouts: Mapping[str, OutputLayout],
    later: Sequence[Shape] = (),
) -> tuple[dict[str, OutputLayout], dict[str, OutputLayout]]:
    """``layouts`` checked against ``outputs``, and those awaited: of an output that may join the
    source, or that a shape of ``later`` (:func:`awaited_shapes`) makes when its input joins,
    checked when it is born. A source whose outputs evolve their schema is asked to keep the
    fields they do not declare, which only a :class:`KeepsUnknownFields` source can."""
    shaped_later = {shape.name for shape in later}
    awaited = {
        name: layout
        for name, layout in layouts.items()
        if name not in outputs and (name in shaped_later or _may_join(source, outputs, name))
    }
    checked = output_layouts(outputs, {name: layout for name, layout in layouts.items() if name not in awaited})
    evolving = sorted(name for name, layout in {**checked, **awaited}.items() if layout.schema_evolution != "none")
    if evolving:
        if not isinstance(source, KeepsUnknownFields):
            raise ConfigError(
                f"outputs.{evolving[0]}.schema_evolution",
                f"a {type(source).__name__} cannot report fields its outputs do not declare",
            )
        source.keep_unknown_fields(evolving)
    return checked, awaited


def check_layouts(
    source: Source, layouts: Mapping[str, OutputLayout], shapes: Sequence[Shape] = (), *, file: str | None = None
) -> None:
    """At ``create``: ``[outputs.<name>]`` names the source's outputs and suits their formats, or
    names an output that may join it (checked at its birth)."""
    outputs = {o.name: o for o in source.outputs()}
    try:
        layouts_of(source, outputs, layouts, awaited_shapes(source, outputs, shapes)[1])
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.reason, file=file) from None

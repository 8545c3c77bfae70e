"""The outputs a pipeline writes: the source's, checked once, and ``_errors`` added by the runtime;
later, those a :class:`~reclock.sources.base.GrowsOutputs` source gains while it runs (:func:`joined_output`).

Checked when a pipeline is built, so a source that declares a bad output fails at ``create`` with
one line naming it, never halfway through a batch; so are their layouts (``[outputs.<name>]``).
"""

from __future__ import annotations

from collections.abc import Mapping

from reclock.errors import ConfigError
from reclock.persist.lake import NAME_PATTERN
from reclock.persist.layout import OutputLayout, output_layouts
from reclock.sources.base import ERRORS, ERRORS_SCHEMA, KeepsUnknownFields, Output, Source

__all__ = ["check_layouts", "joined_output", "layouts_of", "outputs_of"]


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
    if output.envelope not in ("append", "upsert", "debezium"):
        raise ConfigError("outputs", f"output {output.name!r}: unknown envelope {output.envelope!r}")
    if output.envelope != "append" and not output.key:
        raise ConfigError("outputs", f"output {output.name!r}: a {output.envelope} output needs key columns")
    missing = [k for k in output.key if k not in output.schema.names]
    if missing:
        raise ConfigError("outputs", f"output {output.name!r}: key columns {missing} are not in its schema")


def layouts_of(
    source: Source, outputs: Mapping[str, Output], layouts: Mapping[str, OutputLayout]
) -> dict[str, OutputLayout]:
    """``layouts`` checked against ``outputs``; a source whose outputs evolve their schema is asked
    to keep the fields they do not declare, which only a :class:`KeepsUnknownFields` source can."""
    checked = output_layouts(outputs, layouts)
    evolving = sorted(name for name, layout in checked.items() if layout.schema_evolution != "none")
    if evolving:
        if not isinstance(source, KeepsUnknownFields):
            raise ConfigError(
                f"outputs.{evolving[0]}.schema_evolution",
                f"a {type(source).__name__} cannot report fields its outputs do not declare",
            )
        source.keep_unknown_fields(evolving)
    return checked


def check_layouts(source: Source, layouts: Mapping[str, OutputLayout], *, file: str | None = None) -> None:
    """At ``create``: ``[outputs.<name>]`` names the source's outputs and suits their formats."""
    try:
        layouts_of(source, {o.name: o for o in source.outputs()}, layouts)
    except ConfigError as exc:
        raise ConfigError(exc.field, exc.reason, file=file) from None

"""The outputs a pipeline writes: the source's, checked once, and ``_errors`` added by the runtime.

Checked when a pipeline is built, so a source that declares a bad output fails at ``create`` with
one line naming it, never halfway through a batch.
"""

from __future__ import annotations

from reclock.errors import ConfigError
from reclock.persist.lake import NAME_PATTERN
from reclock.sources.base import ERRORS, ERRORS_SCHEMA, Output, Source

__all__ = ["outputs_of"]


def outputs_of(source: Source) -> dict[str, Output]:
    outputs: dict[str, Output] = {}
    for output in source.outputs():
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
        outputs[output.name] = output
    outputs[ERRORS] = Output(ERRORS, ERRORS_SCHEMA)
    return outputs

"""Secrets in a pipeline definition: ``${NAME}`` from the environment, and never shown.

A definition may take any value from the environment (``${NAME}``, so a password is not in the
file), and its values under secret-looking keys are masked wherever the definition is shown: logs,
the ``pipelines`` status table, the status page. Error messages about a value must not echo it
either: they show the ``${NAME}`` reference, or ``***``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from reclock.errors import ConfigError
from reclock.masking import masked

__all__ = ["conceal", "expand", "expand_storage_options", "hidden", "redacted"]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_storage_options(options: Mapping[str, Any], *, file: str | None = None) -> dict[str, Any]:
    """``[storage_options]`` with ``${NAME}`` taken from the environment (an unset one is an error)."""
    return {k: expand(v, f"storage_options.{k}", file) for k, v in options.items()}


# Keys whose values are secrets; not "key" or "ssl" alone: key columns and certificate paths are not.
_SECRET = re.compile(r"pass(word|wd|phrase)?($|_)|secret|token|credential|private_key|api_?key", re.IGNORECASE)


def redacted(value: Any, key: str = "", *, secret: bool = False) -> Any:
    """A copy safe for logs and status tables: values under secret-looking keys are masked.

    Masking goes by the key, whatever the value's type (``sasl_plain_password = 99887766``
    is a number in TOML), and reaches everything nested under such a key. Only ``None`` and
    ``""`` stay visible: they show that no secret is set, not what it is. Under any other key a
    string is masked by its shape (:func:`reclock.masking.masked`: an ``access_key_id``, the
    ``password=`` of a ``dsn``).
    """
    secret = secret or bool(_SECRET.search(key))
    if isinstance(value, Mapping):
        return {k: redacted(v, str(k), secret=secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key, secret=secret) for v in value]
    if secret and value is not None and value != "":
        return "***"
    return masked(value) if isinstance(value, str) else value


def expand(value: Any, key: str, file: str | None) -> Any:
    """Substitute ``${NAME}`` from the environment; an unset variable is an error, not ``""``."""
    if isinstance(value, str):

        def variable(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(key, f"environment variable {name} is not set", file=file)
            return os.environ[name]

        return _ENV.sub(variable, value)
    if isinstance(value, Mapping):
        return {k: expand(v, f"{key}.{k}", file) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, key, file) for v in value]
    return value


def hidden(raw: Any, expanded: Any, key: str = "", secret: bool = False) -> list[tuple[str, str]]:
    """``(value, shown instead)`` for every value an error message must not echo.

    Those are values substituted from ``${NAME}`` (shown as the reference) and values under
    secret-looking keys (shown as ``***``), at any depth of the ``[source]`` table.
    """
    secret = secret or bool(_SECRET.search(key))
    if isinstance(raw, Mapping) and isinstance(expanded, Mapping):
        return [pair for k, v in raw.items() if k in expanded for pair in hidden(v, expanded[k], str(k), secret)]
    if isinstance(raw, list) and isinstance(expanded, list):
        return [pair for r, e in zip(raw, expanded, strict=False) for pair in hidden(r, e, key, secret)]
    if expanded is None or isinstance(expanded, Mapping | list) or str(expanded) == "":
        return []
    if secret:
        return [(str(expanded), "***")]
    if isinstance(raw, str) and _ENV.search(raw):
        return [(str(expanded), raw)]
    return []


def conceal(message: str, hidden: list[tuple[str, str]]) -> str:
    """``message`` without any hidden value: a quoted one becomes what the file says instead.

    A value still found unquoted (a short number inside other text, say) is not replaced piece
    by piece; the message then only says that the value is not shown.
    """
    for value, shown in sorted(hidden, key=lambda pair: -len(pair[0])):
        message = message.replace(repr(value), repr(shown))
        if value in message:
            return f"invalid value (not shown: it comes from {shown if shown != '***' else 'a secret setting'})"
    return message

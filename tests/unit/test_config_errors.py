"""Every field of a definition's sections fails as one line naming the file and the field.

The lines are the ones the parser of 2026-12-02 gave (before the sections became frozen values
read by one typed parser, :mod:`reclock.job.sections`), so the move changed none of them.
"""

from __future__ import annotations

import json

import pytest

from reclock.errors import ConfigError
from reclock.job.config import parse_config

BASE = {"pipeline": {"name": "p", "lake": "/l"}, "source": {"kind": "generator", "rate": 1}}

#: (section, key, value, what the line says after ``p.toml: <section>.<key>: ``)
FIELDS = [
    ("pipeline", "name", 5, "expected a string, got 5"),
    (
        "pipeline",
        "name",
        "9 lives",
        (
            "'9 lives' is not an identifier: use letters, digits and _, "
            "starting with a letter or _, "
            "at most 64 characters (such as '_9_lives')"
        ),
    ),
    ("pipeline", "lake", True, "expected a string, got True"),
    ("pipeline", "engine", "flink", "must be one of spark, local, got 'flink'"),
    ("pipeline", "engine", 1, "expected a string, got 1"),
    ("pipeline", "status_retention_days", 0, "must be a finite number > 0, got 0.0"),
    ("pipeline", "status_retention_days", "7", "expected a number, got '7'"),
    ("pipeline", "metrics_port", 70000, "must be a port number (0 picks a free one)"),
    ("pipeline", "metrics_port", True, "expected an integer, got True"),
    ("pipeline", "metrics_port", 1.5, "expected an integer, got 1.5"),
    ("pipeline", "metrics_host", " ", "must be an address to bind to, such as 127.0.0.1 or 0.0.0.0"),
    ("pipeline", "metrics_host", 1, "expected a string, got 1"),
    ("pipeline", "batch_interval", -1, "must be a finite number >= 0, got -1.0"),
    ("pipeline", "batch_interval", "1", "expected a number, got '1'"),
    ("pipeline", "max_batch", 0, "must be >= 1"),
    ("pipeline", "max_batch", 1.0, "expected an integer, got 1.0"),
    ("pipeline", "max_batch", True, "expected an integer, got True"),
    ("pipeline", "stop_on_error", 1, "expected true or false, got 1"),
    ("pipeline", "max_retries", -1, "must be >= 0"),
    ("pipeline", "file_rows", "x", "expected an integer, got 'x'"),
    ("pipeline", "idle_interval", float("nan"), "must be a finite number >= 0, got nan"),
    ("pipeline", "on_record_error", "explode", "must be one of skip, fail, got 'explode'"),
    (
        "pipeline",
        "colour",
        1,
        (
            "unknown key (known: batch_interval, engine, file_rows, idle_interval, "
            "lake, max_backoff, max_batch, max_retries, metrics_host, "
            "metrics_port, name, on_record_error, retry_backoff, "
            "status_retention_days, stop_on_error)"
        ),
    ),
    ("spark", "master", 1, "expected a string, got 1"),
    ("spark", "conf", "x", "must be a table of Spark settings"),
    ("spark", "conf", [1], "must be a table of Spark settings"),
    ("spark", "small_batch_offsets", -1, "must be >= 0 (0 sends every batch to Spark)"),
    ("spark", "small_batch_offsets", False, "expected an integer, got False"),
    ("spark", "background_start", "yes", "expected true or false, got 'yes'"),
    ("spark", "start_timeout_seconds", 0, "must be a finite number of seconds > 0, got 0.0"),
    ("spark", "start_timeout_seconds", float("inf"), "must be a finite number of seconds > 0, got inf"),
    ("spark", "ui", 1, "expected true or false, got 1"),
    (
        "spark",
        "colour",
        1,
        ("unknown key (known: background_start, conf, master, small_batch_offsets, start_timeout_seconds, ui)"),
    ),
    ("lease", "ttl_seconds", 0.5, "must be a finite number of seconds >= 1, got 0.5"),
    ("lease", "ttl_seconds", "30s", "expected a number, got '30s'"),
    ("lease", "ttl_seconds", True, "expected a number, got True"),
    ("lease", "colour", 1, "unknown key (known: ttl_seconds)"),
    ("maintenance", "every", -1, "must be a whole number >= 0"),
    ("maintenance", "every", 1.5, "expected an integer, got 1.5"),
    ("maintenance", "history_minutes", "x", "expected an integer, got 'x'"),
    ("maintenance", "target_file_mb", 0, "must be >= 1"),
    ("maintenance", "colour", 1, "unknown key (known: every, history_minutes, target_file_mb)"),
]

#: (section, value): a section that is not a table.
SECTIONS = [
    ("spark", 5),
    ("lease", 5),
    ("maintenance", 5),
    ("pipeline", "x"),
]


def _error(raw: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, file="p.toml")
    line = str(caught.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize(("section", "key", "value", "says"), FIELDS)
def test_a_bad_value_of_any_field_is_one_line_naming_it(section, key, value, says):
    raw = json.loads(json.dumps(BASE))
    raw.setdefault(section, {})[key] = value
    assert _error(raw) == f"p.toml: {section}.{key}: {says}"


@pytest.mark.parametrize(("section", "value"), SECTIONS)
def test_a_section_that_is_not_a_table_is_one_line_naming_it(section, value):
    assert _error({**BASE, section: value}) == f"p.toml: {section}: must be a table"


def test_a_missing_name_is_one_line_naming_it():
    assert _error({"source": {"kind": "generator"}, "pipeline": {"lake": "/l"}}) == "p.toml: pipeline.name: missing"


def test_the_parser_calls_with_keywords_and_takes_types_from_annotations():
    """No positional call over five arguments, no field type read from its text (``str(f.type)``)."""
    import ast
    from pathlib import Path

    job = Path(__file__).resolve().parents[2] / "reclock" / "job"
    for module in ("config.py", "sections.py"):
        for node in ast.walk(ast.parse((job / module).read_text())):
            if isinstance(node, ast.Call):
                assert len(node.args) <= 5, (module, node.lineno)
                text = ast.unparse(node)
                assert not (text.startswith("str(") and text.endswith(".type)")), (module, node.lineno)

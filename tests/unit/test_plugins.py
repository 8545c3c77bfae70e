"""Source plugins: ``source.kind`` names a built-in, ``package.module:ClassName`` or an entry point.

Entry points are real distribution metadata (a ``.dist-info`` folder with ``entry_points.txt``,
what pip writes) on ``sys.path``, found by :mod:`importlib.metadata` as for an installed plugin.
The plugin is the test suite's ``sensorlog`` package, the example of ``docs/source-authors.md``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from reclock.errors import ConfigError
from reclock.job.config import build_source, parse_config
from reclock.job.plugins import ENTRY_POINTS, source_class
from reclock.sources.generator import GeneratorSource

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "sensorlog"


def _definition(**source) -> dict:
    return {"pipeline": {"name": "sensors", "engine": "local"}, "source": source}


def _declare(site: Path, dist: str, *lines: str) -> None:
    """Write the metadata pip would write for a distribution declaring ``lines`` as entry points."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\n" + "".join(f"{line}\n" for line in lines))


@pytest.fixture
def importable(monkeypatch):
    """The plugin's folder on ``sys.path``, as ``PYTHONPATH`` would put it."""
    monkeypatch.syspath_prepend(str(PLUGIN))


def test_a_dotted_kind_builds_that_class_with_its_options(importable, tmp_path):
    config = parse_config(_definition(kind="sensorlog.source:SensorLogSource", path=str(tmp_path)))
    source = build_source(config, created_at_ms=0)
    assert type(source).__name__ == "SensorLogSource" and source.path == str(tmp_path)
    assert pickle.loads(pickle.dumps(source)).path == str(tmp_path)  # what Spark does to ship it


def test_an_entry_point_name_resolves_to_the_class_it_declares(importable, tmp_path, monkeypatch):
    _declare(tmp_path / "site", "reclock_sensorlog", "sensorlog = sensorlog.source:SensorLogSource")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    config = parse_config(_definition(kind="sensorlog", path=str(tmp_path)))
    assert type(build_source(config, created_at_ms=0)).__name__ == "SensorLogSource"
    assert config.to_dict()["source"]["kind"] == "sensorlog"  # stored as written, resolved on every load


def test_a_plugin_cannot_shadow_a_built_in_kind(importable, tmp_path, monkeypatch):
    _declare(tmp_path / "site", "impostor", "generator = sensorlog.source:SensorLogSource")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert source_class("generator") is GeneratorSource


def test_two_distributions_claiming_one_name_are_refused_naming_both(importable, tmp_path, monkeypatch):
    _declare(tmp_path / "site", "first", "sensorlog = sensorlog.source:SensorLogSource")
    _declare(tmp_path / "site", "second", "sensorlog = sensorlog:SensorLogSource")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError, match=r"^source\.kind: 'sensorlog' is declared by more than one") as caught:
        parse_config(_definition(kind="sensorlog", path=str(tmp_path)))
    assert "(first)" in str(caught.value) and "(second)" in str(caught.value)


def test_an_unknown_kind_lists_the_built_ins_and_the_installed_plugins(tmp_path, monkeypatch):
    _declare(tmp_path / "site", "reclock_sensorlog", "sensorlog = sensorlog.source:SensorLogSource")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(ConfigError) as caught:
        parse_config(_definition(kind="ftp"))
    assert str(caught.value) == (
        "source.kind: must be one of files, generator, kafka, mysql, postgres, sensorlog (plugin), "
        "or 'package.module:ClassName', got 'ftp'"
    )


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("no_such_package.source:Thing", "cannot import 'no_such_package.source' (no module 'no_such_package')"),
        ("sensorlog.source:Missing", "module 'sensorlog.source' has no 'Missing'"),
        ("sensorlog.source:READINGS", "sensorlog.source:READINGS is not a class"),
        ("sensorlog.source:ConfigError", "is not a source (no outputs, upper, splits, read"),
        (7, "must be one of"),
    ],
)
def test_a_kind_that_names_no_source_is_one_line_on_source_kind(importable, kind, reason):
    with pytest.raises(ConfigError) as caught:
        parse_config(_definition(kind=kind), file="sensors.toml")
    assert str(caught.value).startswith("sensors.toml: source.kind: ") and reason in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_plugin_failing_at_import_is_one_line_naming_the_kind(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('needs a licence key')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing 'broken_plugin' failed: RuntimeError: needs a licence key$"):
        parse_config(_definition(kind="broken_plugin:Source"))


def test_option_names_are_checked_against_the_constructor_before_it_runs(importable, tmp_path):
    with pytest.raises(ConfigError, match=r"^source\.path: missing \(a sensorlog.source:SensorLogSource source"):
        parse_config(_definition(kind="sensorlog.source:SensorLogSource"))
    with pytest.raises(ConfigError, match=r"^source\.paths: unknown option .* \(known: max_split_offsets, path\)"):
        parse_config(_definition(kind="sensorlog.source:SensorLogSource", path=str(tmp_path), paths="x"))


def test_option_values_are_judged_by_the_source_and_reported_on_its_field(importable, tmp_path, monkeypatch):
    config = parse_config(_definition(kind="sensorlog.source:SensorLogSource", path=str(tmp_path), max_split_offsets=0))
    with pytest.raises(ConfigError) as caught:
        build_source(config, created_at_ms=0, file="sensors.toml")
    assert str(caught.value) == "sensors.toml: source.max_split_offsets: must be an integer >= 1, got 0"
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "absent"))
    config = parse_config(_definition(kind="sensorlog.source:SensorLogSource", path="${LOG_DIR}"))
    with pytest.raises(ConfigError, match=r"^source\.path: must be an existing folder .*, got '\$\{LOG_DIR\}'$"):
        build_source(config, created_at_ms=0)  # the expanded value is not echoed, the reference is

"""What only the runtime knows reaches a source in one explicit :class:`SourceContext`, and
``on_record_error`` is one pipeline policy, parsed once, written in ``[pipeline]`` or (as older
definitions do) in ``[source]``."""

from __future__ import annotations

import pytest

from reclock.errors import ConfigError
from reclock.job.config import build_source, parse_config
from reclock.sources.base import ERRORS, RecordError, SourceBase, SourceContext, TakesContext
from reclock.sources.files import FilesSource
from reclock.sources.generator import GeneratorSource
from reclock.sources.kafka import KafkaSource
from reclock.timeline.frontier import Frontier


def _definition(source: dict, **pipeline) -> dict:
    return {"pipeline": {"name": "orders", "engine": "local", **pipeline}, "source": source}


def _csv(folder) -> dict:
    folder.mkdir(exist_ok=True)
    (folder / "a.csv").write_text("id,name\n1,x\nlots,y\n")
    return {"kind": "files", "path": str(folder), "columns": {"id": "int64", "name": "string"}}


def _errors(source) -> list[int]:
    """The offsets of the records ``source`` lands in ``_errors`` when it reads all it has."""
    splits = source.splits(Frontier(), source.upper())
    return [o for s in splits for output, b in source.read(s) if output == ERRORS for o in b["_offset"].to_pylist()]


def test_on_record_error_in_the_pipeline_section_reaches_the_files_source(tmp_path):
    source = build_source(parse_config(_definition(_csv(tmp_path / "in"))), created_at_ms=0)
    assert _errors(source) == [12]  # "lots" is not an int64: skipped to _errors, at its byte offset
    failing = parse_config(_definition(_csv(tmp_path / "in"), on_record_error="fail"))
    assert failing.on_record_error == "fail"
    with pytest.raises(RecordError):
        _errors(build_source(failing, created_at_ms=0))


def test_on_record_error_in_the_source_section_is_still_the_pipelines_policy(tmp_path):
    raw = _definition({**_csv(tmp_path / "in"), "on_record_error": "fail"})
    config = parse_config(raw)
    assert config.on_record_error == "fail"
    assert config.to_dict()["source"]["on_record_error"] == "fail"  # stored as written: it compares equal
    assert "on_record_error" not in config.to_dict()["pipeline"]
    assert parse_config(config.to_dict()) == config
    with pytest.raises(RecordError):
        _errors(build_source(config, created_at_ms=0))
    moved = parse_config(_definition(_csv(tmp_path / "in"), on_record_error="fail"))
    assert moved.to_dict()["pipeline"]["on_record_error"] == "fail" and parse_config(moved.to_dict()) == moved


@pytest.mark.parametrize(
    ("source", "pipeline", "message"),
    [
        ({}, {"on_record_error": "ignore"}, "pipeline.on_record_error: must be one of skip, fail, got 'ignore'"),
        ({"on_record_error": 1}, {}, "source.on_record_error: must be one of skip, fail, got 1"),
        (
            {"on_record_error": "skip"},
            {"on_record_error": "fail"},
            "source.on_record_error: is set in [pipeline] too; say it once, in [pipeline]",
        ),
    ],
)
def test_a_bad_on_record_error_is_one_line_naming_where_it_is_written(tmp_path, source, pipeline, message):
    with pytest.raises(ConfigError) as caught:
        parse_config(_definition({**_csv(tmp_path / "in"), **source}, **pipeline), file="orders.toml")
    assert str(caught.value) == f"orders.toml: {message}"


def test_the_kafka_source_takes_its_group_and_policy_from_the_context():
    config = parse_config(_definition({"kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["t"]}))
    source = build_source(config, created_at_ms=0)
    assert isinstance(source, KafkaSource) and (source.group_id, source.on_record_error) == ("reclock-orders", "skip")
    own = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "group_id": "mine"}
    source = build_source(parse_config(_definition(own, on_record_error="fail")), created_at_ms=0)
    assert (source.group_id, source.on_record_error) == ("mine", "fail")


def test_the_generator_counts_its_rate_from_when_the_pipeline_was_created():
    config = parse_config(_definition({"kind": "generator", "rate": 10.0}))
    source = build_source(config, created_at_ms=1_234)
    assert isinstance(source, GeneratorSource) and source.anchor_ms == 1_234


def test_the_files_source_reads_dropped_generations_through_the_context(tmp_path):
    config = parse_config(_definition(_csv(tmp_path / "in")))
    source = build_source(config, created_at_ms=0, generations_reader=lambda: '{"a.csv": 2}')
    assert isinstance(source, FilesSource)
    size = (tmp_path / "in" / "a.csv").stat().st_size
    assert source.cap(Frontier(), source.upper(), 100) == Frontier({("a.csv", 2): size})  # the current one


class Recorded(SourceBase):
    """A source that keeps the context it was built with, as a plugin may."""

    def __init__(self, size: int) -> None:
        self.size = size

    @classmethod
    def from_config(cls, options, context: SourceContext) -> Recorded:
        source = cls(**options)
        source.context = context
        return source

    def outputs(self): ...
    def upper(self): ...
    def read(self, split): ...


class Plain:
    """Any class with the contract's methods: built from its options alone."""

    def __init__(self, size: int) -> None:
        self.size = size

    def outputs(self): ...
    def upper(self): ...
    def splits(self, lower, upper): ...
    def read(self, split): ...


def test_a_source_class_opts_in_to_the_context_with_from_config(tmp_path):
    assert issubclass(Recorded, TakesContext) and issubclass(SourceBase, TakesContext)
    assert not issubclass(Plain, TakesContext)
    config = parse_config(_definition({"kind": f"{__name__}:Recorded", "size": 3}, on_record_error="fail"))
    source = build_source(config, created_at_ms=77, generations_reader=lambda: '{"x.csv": 4}')
    assert source.size == 3
    assert (source.context.pipeline, source.context.created_at_ms, source.context.on_record_error) == (
        "orders",
        77,
        "fail",
    )
    assert source.context.generations() == {"x.csv": 4}
    plain = build_source(parse_config(_definition({"kind": f"{__name__}:Plain", "size": 5})), created_at_ms=0)
    assert isinstance(plain, Plain) and plain.size == 5

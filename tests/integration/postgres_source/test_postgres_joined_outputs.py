"""A table that joins the publication lands as the definition said of its output before it existed:
``[outputs.<name>]``'s layout (partitioning, ``schema_evolution``), its shaping and its routes,
exactly as for a table the pipeline started with (issue 22: "routable and shapeable like any output").

Each test makes its own database on the session's server, defines the pipeline from TOML through
``reclock create``'s checks, steps it in the driver, adds ``c`` to the publication, and reads the
outputs with delta-rs (``deltalake``, not reclock's reader): the table's partition columns in its
``_delta_log``, its columns and rows.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from reclock.errors import ConfigError
from reclock.job import lifecycle
from reclock.job.config import parse_config
from reclock.persist.lake import Lake
from reclock.runtime.pipeline import Pipeline
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source, query


def _definition(postgres, db: str, tmp_path: Path, tables: list[str], outputs: str, **source: object):
    """A stored definition (``create``'s checks passed) and a pipeline built from it."""
    text = f"""
[pipeline]
name = "pg"
lake = "{tmp_path / "lake"}"
engine = "local"

[source]
kind = "postgres"
dsn = "{postgres.dsn(db)}"
tables = {tables!r}
slot = "s_{db}"
publication = "p_{db}"
{"".join(f"{k} = {v!r}{chr(10)}" for k, v in source.items())}
{outputs}
"""
    config = parse_config(tomllib.loads(text), file="pg.toml")
    lifecycle.create(config, file="pg.toml")
    return config


def _setup(postgres, db: str) -> None:
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE a (id int PRIMARY KEY, v int)", "INSERT INTO a VALUES (1, 1), (2, 2)")


def _join_c(postgres, db: str) -> None:
    execute(
        postgres,
        db,
        "CREATE TABLE c (id int PRIMARY KEY, grp text, v int)",
        "INSERT INTO c SELECT g, 'g' || (g % 3), g FROM generate_series(1, 30) g",
        f"ALTER PUBLICATION p_{db} ADD TABLE c",
    )


def _delta(tmp_path: Path, output: str) -> DeltaTable:
    return DeltaTable(str(Lake.at(tmp_path / "lake").output_path("pg", output)))


def test_a_joined_table_takes_its_outputs_partitioning_and_schema_evolution(postgres, tmp_path):
    db = "joinlayout"
    _setup(postgres, db)
    outputs = '[outputs.public_c]\npartition_by = ["grp"]\nschema_evolution = "add"\n'
    config = _definition(postgres, db, tmp_path, ["a", "*"], outputs)
    source = make_source(postgres, db, tmp_path, tables=["a", "*"])
    pipeline = Pipeline("pg", tmp_path / "lake", source, layouts=config.layouts, shapes=config.shapes)
    pipeline.step()
    _join_c(postgres, db)
    pipeline.step()  # c copied and born, partitioned by grp
    execute(
        postgres,
        db,
        "ALTER TABLE c ADD COLUMN note text",
        "BEGIN; INSERT INTO c VALUES (31, 'g1', 31, 'new'); UPDATE c SET note = 'seen', v = -1 WHERE id = 3; "
        "DELETE FROM c WHERE id = 4; COMMIT",
    )
    pipeline.step()
    c = _delta(tmp_path, "public_c")
    assert c.metadata().partition_columns == ["grp"]
    assert {Path(p).parent.name for p in pa.table(c.get_add_actions(flatten=True)).column("path").to_pylist()} == {
        "grp=g0",
        "grp=g1",
        "grp=g2",
    }
    assert "note" in c.to_pyarrow_table().column_names  # added by schema_evolution = "add"
    rows = c.to_pyarrow_table(columns=["id", "grp", "v", "note"]).to_pylist()
    table = query(postgres, db, "SELECT id, grp, v, note FROM c")
    assert sorted((r["id"], r["grp"], r["v"], r["note"]) for r in rows) == sorted(table)
    drop_slot(postgres, db, source.options.slot)


def test_a_joined_table_is_shaped_and_routed_as_its_outputs_say(postgres, tmp_path):
    db = "joinshape"
    _setup(postgres, db)
    outputs = (
        "[outputs.public_c]\n"
        "sql = \"SELECT op, after['id'] AS id, after['v'] AS v FROM input WHERE op <> 'd'\"\n"
        "[outputs.big_c]\n"
        'from = "public_c"\n'
        "sql = \"SELECT after['id'] AS id FROM input WHERE after['v'] >= 20\"\n"
        'partition_by = ["id"]\n'
    )
    config = _definition(postgres, db, tmp_path, ["a", "*"], outputs, envelope="append")
    source = make_source(postgres, db, tmp_path, tables=["a", "*"], envelope="append")
    pipeline = Pipeline("pg", tmp_path / "lake", source, layouts=config.layouts, shapes=config.shapes)
    pipeline.step()
    _join_c(postgres, db)
    pipeline.step()
    execute(postgres, db, "DELETE FROM c WHERE id = 1", "UPDATE c SET v = 100 WHERE id = 2")
    pipeline.step()
    shaped = _delta(tmp_path, "public_c").to_pyarrow_table()
    assert [n for n in shaped.column_names if not n.startswith("_")] == ["op", "id", "v"]
    # The copy (op r) and the update; the delete filtered out by the shape's WHERE.
    assert sorted((r["op"], r["id"], r["v"]) for r in shaped.to_pylist()) == sorted(
        [("r", g, g) for g in range(1, 31)] + [("u", 2, 100)]
    )
    big = _delta(tmp_path, "big_c")
    assert big.metadata().partition_columns == ["id"]
    assert sorted(r["id"] for r in big.to_pyarrow_table().to_pylist()) == [2, *range(20, 31)]
    drop_slot(postgres, db, source.options.slot)


def test_an_output_that_can_never_exist_is_refused_at_create(postgres, tmp_path):
    """With ``"*"`` a ``<schema>_<table>`` name may join later; a name no table's output can have
    is refused, and without ``"*"`` so is any name the source does not have now."""
    db = "joinrefuse"
    _setup(postgres, db)
    with pytest.raises(ConfigError, match=r"^pg\.toml: outputs\.orders: the source has no output 'orders'") as caught:
        _definition(postgres, db, tmp_path, ["a", "*"], '[outputs.orders]\nschema_evolution = "add"\n')
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"^pg\.toml: outputs\.public_c: the source has no output 'public_c'"):
        _definition(postgres, db, tmp_path, ["a"], '[outputs.public_c]\npartition_by = ["grp"]\n')
    with pytest.raises(ConfigError, match=r"^pg\.toml: outputs\.big\.from: the source has no output 'orders'"):
        shape = '[outputs.big]\nfrom = "orders"\nsql = "SELECT 1 AS x FROM input"\n'
        _definition(postgres, db, tmp_path, ["a", "*"], shape)


def test_the_guides_joining_outputs_are_a_definition_create_takes(postgres, tmp_path):
    """The guide's TOML for outputs of a table not joined yet, pointed at the test server."""
    from tests.docs_blocks import blocks

    guide = Path(__file__).resolve().parents[3] / "docs" / "sources" / "postgres.md"
    (block,) = [b for b in blocks(guide) if b.lang == "toml" and "[outputs.public_loans]" in b.text]
    db = "joinguide"
    postgres.create_database(db)
    execute(postgres, db, "CREATE TABLE checking (id int PRIMARY KEY, balance bigint)")
    definition = tomllib.loads(block.text)
    definition["source"]["dsn"] = postgres.dsn(db)
    definition["pipeline"] = {"name": "bank", "lake": str(tmp_path / "lake"), "engine": "local"}
    config = parse_config(definition, file="bank.toml")
    lifecycle.create(config, file="bank.toml")
    assert {s.name for s in config.shapes} == {"public_loans", "big_loans"}
    assert config.layouts["public_loans"].schema_evolution == "add"

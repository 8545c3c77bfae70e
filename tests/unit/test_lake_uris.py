"""Lakes named by URI: local paths stay what they were, ``s3://`` lakes get a store with safe options."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from reclock.cli.main import main
from reclock.errors import ConfigError
from reclock.job.config import parse_config
from reclock.persist.lake import Lake
from reclock.persist.store import LOCAL, Store, StorePath

SECRET = "wJalrXUtnFEMI-not-a-real-key"


@pytest.fixture(autouse=True)
def _no_aws_environment(monkeypatch):
    """The store falls back to ``AWS_*`` variables: keep the developer's out of these tests."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)


def test_a_local_path_and_a_file_uri_name_the_same_local_lake(tmp_path):
    assert Lake.at(tmp_path) == Lake.at(f"file://{tmp_path}") == Lake(tmp_path.resolve(), LOCAL)
    assert isinstance(Lake.at(tmp_path).output_path("p", "o"), Path)
    assert Lake.at(tmp_path).lease_path("p") == tmp_path.resolve() / "p" / "control" / "lease.json"


def test_an_s3_uri_names_a_bucket_and_prefix_and_paths_join_under_it():
    lake = Lake.at("s3://bucket/lakes/prod/", {"region": "eu-west-1"})
    assert lake.root == StorePath("s3", "bucket", "lakes/prod")
    assert lake.uri == "s3://bucket/lakes/prod"
    assert str(lake.output_path("orders", "bids")) == "s3://bucket/lakes/prod/orders/outputs/bids"
    assert lake.output_path("orders", "bids").location == "bucket/lakes/prod/orders/outputs/bids"
    assert str(lake.status_path("orders").parent) == "s3://bucket/lakes/prod/orders"
    assert str(Lake.at("s3://bucket").definition_path("p")) == "s3://bucket/p/definition.json"


@pytest.mark.parametrize(
    ("uri", "says"),
    [("s3:///prefix", "names no bucket"), ("gs://bucket/x", "unsupported scheme 'gs'")],
)
def test_a_uri_that_names_no_s3_lake_is_one_config_error(uri, says):
    with pytest.raises(ConfigError, match=says) as error:
        Lake.at(uri)
    assert error.value.field == "lake"


def test_storage_options_are_refused_for_a_local_lake(tmp_path):
    with pytest.raises(ConfigError) as error:
        Lake.at(tmp_path, {"region": "us-east-1"})
    assert error.value.field == "storage_options"


def test_an_s3_lake_always_commits_with_conditional_writes_and_refuses_any_other_mode():
    lake = Lake.at("s3://bucket/x", {"endpoint": "http://127.0.0.1:9000", "allow_http": True})
    assert lake.store.delta_options == {
        "aws_endpoint_url": "http://127.0.0.1:9000",
        "aws_allow_http": "true",
        "conditional_put": "etag",
    }
    for unsafe in ("disabled", "dynamo:locks"):
        with pytest.raises(ConfigError, match="must be 'etag'") as error:
            Lake.at("s3://bucket/x", {"conditional_put": unsafe})
        assert error.value.field == "storage_options.conditional_put"


def test_an_unknown_storage_option_is_named_and_unsafe_rename_is_not_an_option():
    with pytest.raises(ConfigError, match="unknown storage option") as error:
        Lake.at("s3://bucket/x", {"aws_s3_allow_unsafe_rename": "true"})
    assert error.value.field == "storage_options.aws_s3_allow_unsafe_rename"


def test_options_given_win_over_the_aws_environment_and_aliases_are_folded():
    environ = {"AWS_ENDPOINT_URL": "http://env:1", "AWS_DEFAULT_REGION": "eu-central-1", "AWS_ACCESS_KEY_ID": "env"}
    store = Store.for_root(StorePath("s3", "b"), {"aws_access_key_id": "given"}, environ=environ)
    assert dict(store.options) == {
        "endpoint": "http://env:1",
        "region": "eu-central-1",
        "access_key_id": "given",
        "conditional_put": "etag",
    }


def test_credentials_are_never_shown_and_a_store_pickles_for_spark_tasks():
    lake = Lake.at("s3://bucket/x", {"secret_access_key": SECRET, "access_key_id": "id"})
    assert SECRET not in repr(lake) and SECRET not in str(lake.root)
    again = pickle.loads(pickle.dumps(lake.store))
    assert again == lake.store and again.options["secret_access_key"] == SECRET


def test_an_s3_lakes_job_lease_is_an_object_in_the_lake_one_per_pipeline():
    """Not a local file: drivers on other machines see the same lease."""
    first, second = Lake.at("s3://bucket/a"), Lake.at("s3://bucket/b")
    assert first.lease_path("p") == StorePath("s3", "bucket", "a/p/control/lease.json")
    assert first.lease_path("p") != second.lease_path("p") != first.lease_path("q")
    assert first.lease_path("p") == Lake.at("s3://bucket/a/").lease_path("p")


def test_a_definition_keeps_an_s3_lake_as_written_and_never_stores_its_storage_options(tmp_path):
    raw = {
        "pipeline": {"name": "p", "lake": "s3://bucket/lakes"},
        "storage_options": {"endpoint": "${S3_ENDPOINT}", "secret_access_key": SECRET},
        "source": {"kind": "generator", "limit": 10},
    }
    config = parse_config(raw, base=tmp_path)
    assert config.lake == "s3://bucket/lakes"
    assert config.storage_options["endpoint"] == "${S3_ENDPOINT}"
    assert "storage_options" not in config.to_dict() and SECRET not in repr(config)
    with pytest.raises(ConfigError, match=r"storage_options\.endpont: unknown storage option"):
        parse_config({**raw, "storage_options": {"endpont": "http://x"}})


def test_a_malformed_storage_option_on_the_command_line_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--lake", "s3://bucket/x", "--storage-option", "region", "status"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--storage-option: must be KEY=VALUE" in err and len(err.strip().splitlines()) == 1


def test_an_unset_variable_in_a_storage_option_is_a_config_error_naming_it(capsys, monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    assert main(["--lake", "s3://bucket/x", "--storage-option", "secret_access_key=${NOT_SET_ANYWHERE}", "status"]) == 2
    assert (
        "storage_options.secret_access_key: environment variable NOT_SET_ANYWHERE is not set" in capsys.readouterr().err
    )

"""Secret shapes the lake-level test (tests/integration/test_status_page_truth.py) cannot seed, and
values that look near a shape but are not secrets, which must stay readable."""

from __future__ import annotations

import pytest

from reclock.masking import masked


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("sasl_password=hunter2-long ok", "sasl_password=*** ok"),
        ("dsn 'host=db pwd='a b c' dbname=x'", "dsn 'host=db pwd=*** dbname=x'"),
        ("key -----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY----- end", "key *** end"),
        ("ASIAY34FZKBOKMUTVV7A expired", "ASIA*** expired"),
        ("Authorization: Bearer abcdefghijklmnop1234", "Authorization: Bearer ***"),
        ('{"url": "https://u:p4ss@host/x"}', '{"url": "https://u:***@host/x"}'),
    ],
)
def test_a_secret_of_a_known_shape_is_masked(text, shown):
    assert masked(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "da39a3ee5e6b4b0d3255bfef95601890afd80709",  # a sha1: no capitals
        "s3://bucket/in/part-00000-3f2a.parquet",
        "http://127.0.0.1:9000/lake",
        "batch 1796187804638 (2,000) went to _errors",
        "AKIA is a prefix",
    ],
)
def test_what_only_looks_near_a_shape_stays(text):
    assert masked(text) == text

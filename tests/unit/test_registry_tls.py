"""The Schema Registry over TLS (issue 23): the stand-in serves HTTPS with a certificate of a CA
the test makes, and asks for a client certificate; the decoder reaches it through
confluent-kafka's client with ``ca_location``, ``certificate_location``, ``key_location`` and
``key_password``. A registry the settings do not trust stalls with a line naming it; a bad
setting is one line naming its field, never showing the key's password."""

from __future__ import annotations

import pytest

from reclock.demo.registry import RegistryStandIn
from reclock.errors import ConfigError
from reclock.job.secrets import redacted
from reclock.sources.decode import make_registry_decoder
from reclock.sources.decode.registry import RegistryUnavailable, check_registry
from tests.registry_payloads import AVRO_V1, avro_serializer, client
from tests.tls import make_authority

RECORD = {"id": 7, "customer": "c", "amount": 1.5, "placed_at": 1_700_000_000_000, "note": None}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    return make_authority(folder), make_authority(folder, "stranger")


@pytest.fixture(scope="module")
def secure(pki):
    ours, _ = pki
    with RegistryStandIn(tls=(ours.server_cert, ours.server_key), client_ca=ours.ca) as running:
        yield running


def _settings(url: str, authority, **overrides) -> dict:
    settings = {
        "url": url,
        "ca_location": str(authority.ca),
        "certificate_location": str(authority.client_cert),
        "key_location": str(authority.client_key),
        "key_password": authority.client_key_password,
    }
    return {k: v for k, v in {**settings, **overrides}.items() if v is not None}


def _value(secure, authority) -> bytes:
    producer = client(
        secure.url,
        ca_location=str(authority.ca),
        certificate_location=str(authority.client_cert),
        key_location=str(authority.client_key),
        key_password=authority.client_key_password,
    )
    return avro_serializer(producer, AVRO_V1)("tls", RECORD)


def test_values_decode_through_a_registry_served_over_mutual_tls(secure, pki):
    ours, _ = pki
    value = _value(secure, ours)
    assert secure.url.startswith("https://")
    decoder = make_registry_decoder(
        "avro", None, schema_registry=_settings(secure.url, ours), reader_schema={"subject": "tls-value", "version": 1}
    )
    row = decoder.decode([value]).batch.to_pylist()[0]
    assert (row["id"], row["customer"], row["amount"]) == (7, "c", 1.5)
    assert ours.client_key_password not in repr(decoder)
    shown = redacted({"schema_registry": _settings(secure.url, ours)})
    assert shown["schema_registry"]["key_password"] == "***"


def test_a_registry_the_ca_does_not_sign_stalls_with_a_line_naming_it(secure, pki):
    ours, stranger = pki
    value = _value(secure, ours)
    decoder = make_registry_decoder(
        "avro", {"id": "int64"}, schema_registry=_settings(secure.url, ours, ca_location=str(stranger.ca))
    )
    with pytest.raises(RegistryUnavailable) as refused:
        decoder.decode([value])
    message = str(refused.value)
    assert message.startswith(f"schema registry {secure.url}: TLS handshake failed")
    assert "not trusted" in message and "schema_registry.ca_location" in message


def test_a_registry_that_wants_a_client_certificate_stalls_without_one(secure, pki):
    ours, _ = pki
    value = _value(secure, ours)
    settings = _settings(secure.url, ours, certificate_location=None, key_location=None, key_password=None)
    decoder = make_registry_decoder("avro", {"id": "int64"}, schema_registry=settings)
    with pytest.raises(RegistryUnavailable) as refused:
        decoder.decode([value])
    assert str(refused.value).startswith(f"schema registry {secure.url}: TLS handshake failed")
    assert "CERTIFICATE_REQUIRED" in str(refused.value) and "schema_registry.certificate_location" in str(refused.value)


def test_bad_tls_settings_are_one_line_naming_the_field(pki, tmp_path):
    ours, stranger = pki
    url = "https://registry.example:8081"
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    cases = [
        ({"ca_location": str(tmp_path / "missing.pem")}, "ca_location", "no such file"),
        ({"ca_location": str(not_pem)}, "ca_location", "not a PEM file"),
        ({"certificate_location": None}, "key_location", "needs certificate_location"),
        ({"key_password": "wrong-pass-123"}, "key_password", "does not open the private key"),
        ({"key_password": None}, "key_password", "the private key is encrypted"),
        ({"key_location": str(stranger.server_key)}, "key_location", "is not the key of certificate_location"),
        ({"certificate_location": str(ours.client_key)}, "certificate_location", "holds no PEM certificate"),
        ({"url": "http://registry.example:8081"}, "ca_location", "needs an https:// url"),
        ({"ca_location": 5}, "ca_location", "must be a non-empty string"),
    ]
    for overrides, field, words in cases:
        with pytest.raises(ConfigError) as error:
            given = _settings(overrides.pop("url", url), ours, **overrides)
            check_registry(given, "source.schema_registry")
        assert error.value.field == f"source.schema_registry.{field}", (overrides, str(error.value))
        assert words in str(error.value) and "\n" not in str(error.value)
        assert "wrong-pass-123" not in str(error.value) and ours.client_key_password not in str(error.value)

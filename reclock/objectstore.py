"""Reaching S3: option names, their ``AWS_*`` fallbacks, and pyarrow's S3 file system for them.

Two parts of reclock talk to object stores and may not import each other (see the import
contracts): the lake (:mod:`reclock.persist.store`) and the files source
(:mod:`reclock.sources.files.store`). What both need lives here, once: the storage options a
user may write, spelled one canonical way, merged over the standard environment, and one
:class:`pyarrow.fs.S3FileSystem` per process and set of options.

Options hold credentials, so nothing here shows them: no ``repr``, no message quotes a value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pyarrow import fs as pafs

from reclock.errors import ConfigError

__all__ = ["STORAGE_OPTIONS", "canonical_options", "s3_filesystem", "with_environment"]

#: The storage options accepted, with the ``AWS_*`` environment variable each falls back to.
STORAGE_OPTIONS: Mapping[str, str | None] = {
    "endpoint": "AWS_ENDPOINT_URL",
    "region": "AWS_REGION",
    "access_key_id": "AWS_ACCESS_KEY_ID",
    "secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
    "allow_http": "AWS_ALLOW_HTTP",
    "virtual_hosted_style_request": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "conditional_put": None,
}

_ALIASES = {
    "endpoint_url": "endpoint",
    "aws_endpoint": "endpoint",
    "aws_endpoint_url": "endpoint",
    "aws_region": "region",
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "aws_session_token": "session_token",
    "token": "session_token",
    "aws_allow_http": "allow_http",
    "aws_virtual_hosted_style_request": "virtual_hosted_style_request",
    "aws_conditional_put": "conditional_put",
}

_TRUE = ("1", "true", "yes", "on")


def canonical_options(options: Mapping[str, Any], *, field: str = "storage_options") -> dict[str, str]:
    """``options`` under their canonical names, as strings; an unknown one is a ConfigError
    naming ``field.key`` (the value is never quoted: it may be a secret)."""
    out: dict[str, str] = {}
    for raw, value in options.items():
        key = _ALIASES.get(str(raw).lower(), str(raw).lower())
        if key not in STORAGE_OPTIONS:
            raise ConfigError(f"{field}.{raw}", f"unknown storage option (known: {', '.join(sorted(STORAGE_OPTIONS))})")
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int):
            raise ConfigError(f"{field}.{raw}", "must be a string")
        out[key] = str(value)
    return out


def with_environment(
    options: Mapping[str, Any], *, field: str = "storage_options", environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Canonical ``options`` over the ``AWS_*`` environment (``AWS_DEFAULT_REGION`` too): given
    options win, so a pipeline's settings are not overridden by whatever the shell exports."""
    environ = os.environ if environ is None else environ
    merged = {k: environ[v] for k, v in STORAGE_OPTIONS.items() if v is not None and v in environ}
    if "region" not in merged and "AWS_DEFAULT_REGION" in environ:
        merged["region"] = environ["AWS_DEFAULT_REGION"]
    merged.update(canonical_options(options, field=field))
    return merged


def s3_filesystem(options: Mapping[str, str]) -> pafs.FileSystem:
    """pyarrow's S3 file system for canonical ``options``, one per process and options: its
    client and connection pool are reused by every listing and read."""
    key = tuple(sorted(options.items()))
    found = _FILESYSTEMS.get(key)
    if found is None:
        found = _FILESYSTEMS[key] = _s3(options)
    return found


_FILESYSTEMS: dict[tuple[tuple[str, str], ...], pafs.FileSystem] = {}


def _s3(options: Mapping[str, str]) -> pafs.FileSystem:
    endpoint = options.get("endpoint")
    http = options.get("allow_http", "false").lower() in _TRUE
    kwargs: dict[str, Any] = {
        "access_key": options.get("access_key_id"),
        "secret_key": options.get("secret_access_key"),
        "session_token": options.get("session_token"),
        "region": options.get("region"),
        "force_virtual_addressing": options.get("virtual_hosted_style_request", "false").lower() in _TRUE,
        # An output stream starts no multipart upload until it holds a part's worth of bytes, so a
        # small object (a status snapshot, a batch's parquet file) is one PUT, not three requests.
        "allow_delayed_open": True,
    }
    if endpoint:
        kwargs["endpoint_override"] = endpoint
        kwargs["scheme"] = "http" if endpoint.startswith("http://") or http else "https"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})

"""Secrets recognised by their shape, wherever they appear: :func:`masked` is the last guard of
every text reclock shows (an answer of the status page, a log line, a status file).

Masking by key name (:func:`reclock.job.secrets.redacted`) misses a secret under an innocent key
(``access_key_id``, a ``dsn``) and one inside a message (an error that quotes a connection string).
So these shapes are masked whatever the key (issue 41, item 2):

* AWS access key ids (``AKIA``, ``ASIA``... and 16 capitals or digits): their kind stays
  (``AKIA***``), the identity goes;
* 40-character base64 runs that mix capitals, small letters and digits (an AWS secret key's shape;
  a hex digest has no capitals, a path has dots or dashes);
* a libpq or ODBC ``password=...``, ``pwd=...`` (quoted or not; ``sasl_password=`` too), and a URL's ``user:password@``;
* a PEM private key, GitHub and Slack tokens, an HTTP ``Bearer`` credential.

Each pattern stops at a quote, so a shape inside a JSON string is masked without eating the JSON.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "masked"]

MASK = "***"

_B64 = "A-Za-z0-9/+"
_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL), MASK),
    (re.compile(r"\b(AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}\b"), rf"\1{MASK}"),
    (
        re.compile(
            rf"(?<![{_B64}=])(?=[{_B64}]{{0,39}}[A-Z])(?=[{_B64}]{{0,39}}[a-z])(?=[{_B64}]{{0,39}}[0-9])"
            rf"[{_B64}]{{40}}(?![{_B64}=])"
        ),
        MASK,
    ),
    (re.compile(r"(?i)(?<![a-z])(password|passwd|pwd)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\",;&]+)"), rf"\1\2{MASK}"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@'\"]*:)[^\s@/'\"]+@"), rf"\1{MASK}@"),
    (re.compile(r"\b(gh[pousr]_)[A-Za-z0-9]{30,}"), rf"\1{MASK}"),
    (re.compile(r"\b(xox[abprs]-)[A-Za-z0-9-]{10,}"), rf"\1{MASK}"),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]{16,}=*"), rf"\1{MASK}"),
)


def masked(text: str) -> str:
    """``text`` with every secret of a known shape (see the module doc) replaced by ``***``."""
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    return text

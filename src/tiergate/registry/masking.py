"""Secrets out of every registry or store location tiergate prints: the one masking function.

`masked(url)` hides the password of `user:password@` and the value of every query parameter whose name
looks like a secret (password, passwd, pwd, secret, token, key, access_key, secret_key, sslpassword,
credential, auth, signature, session, ...); `masked_text(text)` does the same to every URL in a message
(a driver's or an S3 client's) and to `name=value` pairs whose name looks like a secret (libpq's
`password=...` connection strings). Stdlib only.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|key|credential|auth|signature|session|^sig$", re.IGNORECASE)
_QUERY_PAIR = re.compile(r"(?P<pre>[?&;])(?P<name>[^=&;#?]+)=(?P<value>[^&;#]*)")
# the same pair percent-encoded, as an object store's client writes a query that became part of a key
_ENCODED_PAIR = re.compile(r"(?P<pre>%3F|%26|%3B)(?P<name>[\w.\-]+)%3D(?P<value>.*?)(?=%26|%3B|%23|[/&;#?'\"\s]|$)",
                           re.IGNORECASE)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
_PAIR = re.compile(r"(?P<name>(?<![\w.%-])[A-Za-z_][\w.-]*)(?P<eq>\s*=\s*)(?P<value>'[^']*'|\"[^\"]*\"|[^\s&;,'\"]+)")
_TRAILING = ".,:;)]}'\""


def is_secret_name(name: str) -> bool:
    """Whether a parameter name looks like it holds a secret."""
    return bool(_SECRET_NAME.search(unquote(name)))


def masked(url) -> str:
    """`url` (any string; it need not parse) with every secret-looking part replaced by ***."""
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _mask_query(text)
    head = re.split(r"[?#]", rest, maxsplit=1)[0]
    at = head.rfind("@")
    if at >= 0 and ":" in head[:at]:             # user:password@ (a password may hold '/' or '@' unencoded)
        user = head[:at].split(":", 1)[0]
        rest = f"{user}:{MASK}{rest[at:]}"
    return f"{scheme}{sep}{_mask_query(rest)}"


def _mask_query(text: str) -> str:
    text = _ENCODED_PAIR.sub(lambda m: f"{m['pre']}{m['name']}%3D{MASK}" if is_secret_name(m["name"]) else m[0],
                             text)
    if "?" not in text:
        return text
    path, _, query = text.partition("?")
    query = _QUERY_PAIR.sub(lambda m: f"{m['pre']}{m['name']}={MASK}" if is_secret_name(m["name"]) else m[0],
                            "?" + query)
    return path + query


def masked_text(text) -> str:
    """A message with every URL in it masked, and every secret-looking `name=value` pair outside them."""
    def url(m: re.Match) -> str:
        found = m[0]
        stripped = found.rstrip(_TRAILING)
        return masked(stripped) + found[len(stripped):]

    text = _URL.sub(url, str(text))
    return _PAIR.sub(lambda m: f"{m['name']}{m['eq']}{MASK}" if is_secret_name(m["name"]) and not m["value"].startswith(MASK)
                     else m[0], text)

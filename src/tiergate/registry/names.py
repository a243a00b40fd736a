"""Validation of what users type into the registry: model names, tags, dates, hashes."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from tiergate.errors import InputError

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TAG_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")
_SHA_PREFIX = re.compile(r"^[0-9a-f]{6,64}$")


def model_name(name: str) -> str:
    """A model name safe to use as a path part: letters, digits, '.', '_', '-' (no '..')."""
    if not MODEL_NAME.fullmatch(name) or ".." in name:
        raise InputError(
            f"model name {name!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, without '..'"
        )
    return name


def tags(pairs: list[str]) -> dict[str, str]:
    """`k=v` strings into a dict; a repeated key or a pair without '=' is an error."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not _TAG_KEY.fullmatch(key):
            raise InputError(f"tag {pair!r} is not KEY=VALUE with a simple key (letters, digits, ._:/-)")
        if key in out:
            raise InputError(f"tag {key!r} is given twice")
        out[key] = value.strip()
    return out


def sha_prefix(text: str) -> str:
    """A lower-case hex sha256 or a prefix of at least 6 characters."""
    text = text.strip().lower()
    if not _SHA_PREFIX.fullmatch(text):
        raise InputError(f"{text!r} is not an artifact sha256 (or a hex prefix of 6+ characters)")
    return text


def since(text: str) -> datetime:
    """An ISO date or date-time; naive values are taken as UTC."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"--since {text!r} is not an ISO date (YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)

"""The seal of decisions, fast-path entries, saved runs and cache folders: an HMAC-SHA256 under a key kept outside
the home (`cache_key_path`: $TIERGATE_CACHE_KEY, else ${XDG_CONFIG_HOME:-~/.config}/tiergate/cache.key, 32 random
bytes made 0600 on first use, a regular file of this user's never read through a link)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from pathlib import Path

from tiergate.state.writing import part_path, write_json

CACHE_KEY_BYTES = 32
SEAL = "seal"
_KEY_WARNED: set[str] = set()


def cache_key_path() -> Path:
    """Where the cache's seal key lives: outside the home, so a home copied from elsewhere is not trusted."""
    explicit = os.environ.get("TIERGATE_CACHE_KEY")
    if explicit:
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "tiergate" / "cache.key"


def cache_key() -> bytes | None:
    """The seal key (made on first use, atomically: two gates at once agree on one key); None when it can be
    neither read nor made (a warning once: the gate then decides and caches nothing)."""
    path = cache_key_path()
    try:
        if _inside_home(path):
            raise ValueError("it lies inside TIERGATE_HOME: a home restored from elsewhere would bring its own key")
        key = _read_key(path)
        if key is None:
            key = _make_key(path)
        if len(key) != CACHE_KEY_BYTES:
            raise ValueError(f"it holds {len(key)} bytes, not {CACHE_KEY_BYTES}")
        return key
    except (OSError, ValueError) as exc:
        if str(path) not in _KEY_WARNED:
            _KEY_WARNED.add(str(path))
            text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"tiergate: warning: the cache key {path} is unusable ({text}); decisions are not cached and "
                  "saved runs are not reused", file=sys.stderr)
        return None


def _inside_home(path: Path) -> bool:
    from tiergate.paths import home_path

    try:
        resolved, root = Path(path).resolve(), home_path().resolve()
    except OSError:
        return False
    return resolved == root or root in resolved.parents


def _read_key(path: Path) -> bytes | None:
    """The key's bytes, read without following a link, from a regular file this user owns that nobody else may
    read or write (mode 0600 or stricter); ValueError saying why otherwise (the key is then unusable: a key others
    can read lets them forge seals, one others can write lets them choose it)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if Path(path).is_symlink():
            raise ValueError("it is a symbolic link; the key must be a file of its own") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        if info.st_uid != os.geteuid():
            raise ValueError(f"it is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})")
        if info.st_mode & 0o077:
            raise ValueError(f"its mode is {stat.S_IMODE(info.st_mode):04o}: others may read or write it "
                             f"(chmod 600 {path})")
        return os.read(fd, CACHE_KEY_BYTES + 1)
    finally:
        os.close(fd)


def _make_key(path: Path) -> bytes:
    """32 random bytes, written 0600 to a new part file (never through a link) and linked into place: the first
    writer wins, every other one reads the winner's key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = part_path(path)
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)         # whatever the umask
            handle.write(os.urandom(CACHE_KEY_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    key = _read_key(path)
    if key is None:
        raise FileNotFoundError(f"{path} vanished as it was made")
    return key


def seal_of(doc: dict, key: bytes) -> str:
    """The HMAC-SHA256 of a document (its canonical JSON, without its own seal)."""
    body = json.dumps({k: v for k, v in doc.items() if k != SEAL}, sort_keys=True, allow_nan=False)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def write_sealed(path: Path, doc: dict, *, sort_keys: bool = False) -> Path | None:
    """Write a sealed JSON document atomically (its key order kept unless `sort_keys`: the seal is over the
    canonical form); None (nothing written) when there is no usable cache key."""
    key = cache_key()
    if key is None:
        return None
    return write_json(path, {**doc, SEAL: seal_of(doc, key)}, sort_keys=sort_keys)


def read_sealed(path: Path) -> tuple[dict | None, str]:
    """(the document, "") when its seal verifies under this machine's key; else (None, why): "absent",
    "unreadable", "unsealed" (no seal or a wrong one: edited, or sealed under another key) or "no key"."""
    try:
        if Path(path).is_symlink():            # a sealed file is the home's own: never read through a link
            return None, "unreadable"
        doc = json.loads(path.read_text(), parse_constant=_no_constant)
    except FileNotFoundError:
        return None, "absent"
    except (OSError, ValueError, RecursionError):
        return None, "unreadable"
    if not isinstance(doc, dict):
        return None, "unreadable"
    key = cache_key()
    if key is None:
        return None, "no key"
    seal = doc.get(SEAL)
    try:
        expected = seal_of(doc, key)
    except (ValueError, TypeError, RecursionError):
        return None, "unreadable"
    if not isinstance(seal, str) or not hmac.compare_digest(seal, expected):
        return None, "unsealed"
    return doc, ""


def _no_constant(name: str):
    """JSON's NaN and Infinity are never in a sealed file (it is written with allow_nan=False)."""
    raise ValueError(f"{name} in a sealed file")

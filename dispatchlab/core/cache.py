"""Files the core can rebuild but would rather not: the compiled pattern database, the loaded knowledge base.

Keyed by a digest of what they were built from, written atomically, and ignored when unreadable: a stale,
foreign or read-only cache only costs the time to rebuild.
"""

from __future__ import annotations

import os
from pathlib import Path

from dispatchlab.core.digest import sha256_hex


def cache_dir() -> Path:
    base = os.environ.get("DISPATCHLAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dispatchlab"
    )
    return Path(base)


def cache_path(kind: str, key: object, suffix: str) -> Path:
    digest = sha256_hex(repr(key).encode())[:24]
    return cache_dir() / f"{kind}-{digest}{suffix}"


def read_cached(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def write_cached(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: rebuild every time

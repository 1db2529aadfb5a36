"""SHA-256 for fingerprints and cache names, without loading OpenSSL.

`hashlib` loads OpenSSL's libcrypto on import (about 3 ms, more than a one-line parse takes); CPython's own
built-in SHA-256 gives the same digests. As the standard library's `random` does for SHA-512: the lean module
first, `hashlib` where this Python has none (3.12 renamed it `_sha2`).
"""

from __future__ import annotations

__all__ = ["sha256", "sha256_hex"]

try:
    from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - other Python versions
    try:
        from _sha2 import sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError:
        from hashlib import sha256  # type: ignore[assignment, no-redef, unused-ignore]


def sha256_hex(data: bytes) -> str:
    """The hex SHA-256 of `data`, as `hashlib.sha256(data).hexdigest()`."""
    digest: str = sha256(data).hexdigest()
    return digest

"""Finding the browser the flows drive: skip where it is missing, except in CI, where that fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


def in_ci() -> bool:
    """`.ci/run` exports DISPATCHLAB_CI=1: there a missing browser is a broken run, not a skip."""
    return os.environ.get("DISPATCHLAB_CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def require_chromium(path: str = CHROMIUM) -> str:
    if Path(path).exists():
        return path
    message = f"needs Debian's chromium at {path} (apt-get install -y chromium)"
    if in_ci():
        pytest.fail(
            f"{message}; DISPATCHLAB_CI is set, so the browser tests may not be skipped", pytrace=False
        )
    pytest.skip(message)

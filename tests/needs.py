"""What some tests need beyond the web stack: missing in CI is a failure, elsewhere a skip."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_torch() -> None:
    """The repro server runs its MoE layer with torch; the test extra installs the CPU build."""
    if importlib.util.find_spec("torch") is not None:
        return
    message = "torch is not installed (pip install -e '.[test]' brings the CPU build)"
    if os.environ.get("DISPATCHLAB_CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)

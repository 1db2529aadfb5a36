"""Versions of the packages the worker reports, read from package metadata (nothing heavy imported)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

# Reported key -> distribution name.
PACKAGES = {
    "sglang": "sglang",
    "vllm": "vllm",
    "flashinfer": "flashinfer-python",
    "flashinfer-cubin": "flashinfer-cubin",
    "flashinfer-jit-cache": "flashinfer-jit-cache",
    "sgl-kernel": "sgl-kernel",
    "torch": "torch",
    "triton": "triton",
    "nvidia-ml-py": "nvidia-ml-py",
}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for key, dist in PACKAGES.items():
        try:
            versions[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def torch_cuda_version() -> str | None:
    """torch.version.cuda, read from torch/version.py without importing torch (seconds, and a CUDA init)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return m.group(1) if m else None
    return None

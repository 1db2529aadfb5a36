"""The GPU worker stays in rooms one can read: no Python module under worker/ over 600 lines (the toy
models' generated data under worker/repro/models is not code and is left out)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"
LIMIT = 600
GENERATED = (WORKER / "repro" / "models",)


def worker_modules() -> list[Path]:
    return sorted(
        path
        for path in WORKER.rglob("*.py")
        if not any(path.is_relative_to(folder) for folder in GENERATED) and "__pycache__" not in path.parts
    )


def test_no_worker_module_is_over_600_lines():
    modules = worker_modules()
    assert WORKER / "probes" / "harness.py" in modules and WORKER / "sweep" / "__init__.py" in modules
    too_long = {
        str(path.relative_to(ROOT)): count
        for path in modules
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert too_long == {}, f"split these by responsibility (at most {LIMIT} lines each): {too_long}"

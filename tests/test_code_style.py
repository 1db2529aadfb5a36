"""The house rules CI enforces: ruff clean and formatted everywhere, mypy strict on the core and the worker."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing_and_everything_is_formatted():
    check = _run("ruff", "check", ".")
    assert check.returncode == 0, check.stdout[-3000:]
    fmt = _run("ruff", "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout[-3000:]


def test_the_core_and_the_worker_pass_mypy_strict():
    result = _run("mypy")
    assert result.returncode == 0, result.stdout[-3000:]


def test_no_two_test_modules_share_a_name_where_pytest_would_refuse_to_collect_the_second():
    """Outside a package pytest imports a test file by its base name: a second `test_x.py` in another
    folder stops the whole run at collection (as `tests/web/test_redaction.py` beside a pipeline one did)."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(tests.rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(tests)} and {path.relative_to(tests)}")
        seen.setdefault(path.name, path)
    assert not clashes, clashes

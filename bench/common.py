"""Shared bits of the benchmark scripts: the test log, timing whole commands, peak memory of a child."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PYTHON = sys.executable


def ensure_log(size: int, seed: int = 1) -> Path:
    """Make (once) a realistic serving log of `size` bytes; reuse it on later runs."""
    from genlog import write_log

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"serving-{size}-{seed}.log"
    if not path.exists():
        print(f"writing {path} ({size / 1e6:,.0f} MB) ...", file=sys.stderr)
        tmp = path.with_suffix(".tmp")
        write_log(tmp, size, seed)
        tmp.rename(path)
    return path


def run_measured(
    command: list[str], *, stdout_to: str | None = os.devnull, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Run a command; return (wall seconds, peak RSS MB of the child)."""
    with open(stdout_to or os.devnull, "wb") as sink:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):  # grep -c exits 1 when nothing matched
        raise SystemExit(
            f"{command[0]} failed ({process.returncode}): {process.stderr.read().decode()[-500:] if process.stderr else ''}"
        )
    return elapsed, usage.ru_maxrss / 1024


def median_run(command: list[str], runs: int, **kwargs) -> tuple[float, float]:
    results = [run_measured(command, **kwargs) for _ in range(runs)]
    return statistics.median(r[0] for r in results), max(r[1] for r in results)

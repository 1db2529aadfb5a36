"""Shared bits of the benchmark scripts: the test log, timing whole commands, peak memory of a child."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PYTHON = sys.executable


def log_from_args(description: str) -> tuple[argparse.Namespace, Path]:
    """The benchmarks' shared options: --size of the generated log, or --log to take one; --runs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", type=float, default=float(1 << 30))
    parser.add_argument("--log", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    return args, args.log or ensure_log(int(args.size))


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


def run_measured(command: list[str], *, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run a command; return (wall seconds, peak RSS MB of the command). /usr/bin/time reports the peak
    of the exec'd command itself (a forked child's own rusage would count the parent's pages too)."""
    with open(os.devnull, "wb") as sink:
        start = time.perf_counter()
        result = subprocess.run(
            ["/usr/bin/time", "-f", "%M", *command], stdout=sink, stderr=subprocess.PIPE, env=env
        )
        elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1):  # grep -c exits 1 when nothing matched
        raise SystemExit(f"{command[0]} failed ({result.returncode}): {result.stderr.decode()[-500:]}")
    peak_kb = int(result.stderr.decode().strip().splitlines()[-1])
    return elapsed, peak_kb / 1024


def median_run(command: list[str], runs: int, **kwargs) -> tuple[float, float]:
    results = [run_measured(command, **kwargs) for _ in range(runs)]
    return statistics.median(r[0] for r in results), max(r[1] for r in results)

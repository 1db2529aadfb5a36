"""Run a command and measure it whole: wall and CPU seconds, and the peak memory of its process tree.

Memory is the sum of PSS (proportional set size: shared pages split between the processes that map
them) over the command and every descendant, sampled every 10 ms, so forked workers count and pages
they share with their parent count once. Output goes to a file, never /dev/null: GNU grep notices
/dev/null and stops at its first match.
"""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass
class TreeRun:
    wall: float
    cpu: float  # user + system seconds of the command and all its descendants
    peak_mb: float  # peak PSS of the whole tree
    output: bytes
    returncode: int


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found.extend(int(c) for c in handle.read().split())
    except OSError:
        pass
    return found


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_mb(root: int) -> float:
    total = 0
    stack = [root]
    while stack:
        pid = stack.pop()
        total += _pss_kb(pid)
        stack.extend(_children(pid))
    return total / 1024


def run_tree(
    command: list[str], *, env: dict[str, str] | None = None, sample_every: float | None = 0.01
) -> TreeRun:
    """`sample_every=None`: no memory sampling (peak 0), for a timing run: reading a process's smaps_rollup
    takes the lock its page faults wait on, so a sampled forked tree runs slower than it would."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env)
        peak = 0.0
        if sample_every is None:
            process.wait()
        while process.poll() is None:
            peak = max(peak, tree_pss_mb(process.pid))
            time.sleep(sample_every or 0.01)
        wall = time.perf_counter() - start
        out.seek(0)
        output = out.read()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return TreeRun(wall, cpu, peak, output, process.returncode)

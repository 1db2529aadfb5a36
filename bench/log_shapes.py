"""Every shape of log at full speed in flat memory: one table, one line per shape (and its .gz).

    python bench/log_shapes.py [--size 100MB] [--shapes crash_loop,ranks64] [--no-gz] [--runs 1] [--repeat 10]

Generates (once, under bench/out/shapes/) each shape of bench/shapes.py at --size bytes and a .gz of it,
then times on the same file, in the same run: the shared 224-pattern grep reference
(`LC_ALL=C grep -c -E -f ../shared/bench/patterns.txt FILE > file`), the project's own grep reference
(every rule and knowledge-base pattern, bench/parse_throughput.py), and `dispatchlab match --json`. For a
.gz both greps read `gzip -dc FILE |`. MB/s is of the uncompressed bytes; `tree MB` is the peak PSS of the
whole process tree (forked scan workers counted); the goals: >= 100 MB/s and < 150 MB on every shape.
`--repeat 10` times each shape's file written ten times over, one after the other: the shared bench's 1 GiB
reference is its 100 MB log repeated ten times (../shared/bench/README.md). Times come from runs without the
memory sampler, `tree MB` from one more run with it (reading a process's smaps slows its page faults: a sampled
forked tree ran 10% slower). Also prints the start-up time of
`dispatchlab match` on a one-line log, with `python -c pass` timed in the same run as its reference
(bench/startup.py).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, parse_size
from parse_throughput import GREP_ENV, grep_command, match_command, pattern_file
from shapes import SHAPES
from startup import startup_figures, startup_line
from treerun import TreeRun, run_tree

SHARED_PATTERNS = Path(__file__).resolve().parents[2] / "shared" / "bench" / "patterns.txt"
if not SHARED_PATTERNS.exists():
    SHARED_PATTERNS = Path("/work/shared/bench/patterns.txt")
GOAL_MB_S = 100
GOAL_TREE_MB = 150


def shape_file(name: str, size: int) -> Path:
    folder = OUT / "shapes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{size}.log"
    if not path.exists():
        print(f"writing {path.name} ...", file=sys.stderr)
        tmp = path.with_suffix(".tmp")
        SHAPES[name](tmp, size)
        tmp.rename(path)
    return path


def repeated_file(path: Path, times: int) -> Path:
    if times <= 1:
        return path
    out = path.with_name(f"{path.stem}-x{times}.log")
    if not out.exists():
        print(f"writing {out.name} ...", file=sys.stderr)
        tmp = out.with_suffix(".tmp")
        with tmp.open("wb") as dst:
            for _ in range(times):
                with path.open("rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 22)
        tmp.rename(out)
    return out


def gz_file(path: Path) -> Path:
    out = path.with_suffix(".log.gz")
    if not out.exists():
        print(f"writing {out.name} ...", file=sys.stderr)
        tmp = out.with_suffix(".tmp")
        with path.open("rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        tmp.rename(out)
    return out


def grep_run(patterns: Path, log: Path) -> TreeRun:
    if log.suffix == ".gz":
        command = ["sh", "-c", f"gzip -dc '{log}' | grep -c -E -f '{patterns}'"]
    else:
        command = grep_command(patterns, log)
    return run_tree(command, env=GREP_ENV, sample_every=None)


def best(runs: list[TreeRun]) -> TreeRun:
    chosen = sorted(runs, key=lambda r: r.wall)[len(runs) // 2]
    return TreeRun(chosen.wall, chosen.cpu, max(r.peak_mb for r in runs), chosen.output, chosen.returncode)


def startup_ms() -> float:
    """The median wall milliseconds of `dispatchlab match --json` on a one-line log (bench/startup.py)."""
    return startup_figures(7)["match_wall_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", type=parse_size, default=100 * 1000 * 1000, help="bytes per shape: 100MB, 1GiB"
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ",".join(SHAPES))
    parser.add_argument("--no-gz", action="store_true", help="skip the .gz of each shape")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="each shape's file this many times over")
    args = parser.parse_args()
    own_patterns = OUT / "patterns.ere"
    OUT.mkdir(parents=True, exist_ok=True)
    pattern_file(own_patterns)
    repeat = f" x {args.repeat}" if args.repeat > 1 else ""
    print(
        f"cores: {os.cpu_count()}, size per shape: {args.size / 1e6:,.0f} MB{repeat}, runs: {args.runs} (median)"
    )
    print(startup_line(startup_figures(7)))
    header = (
        f"{'shape':<20} {'MB':>6} {'grep224 s':>9} {'own grep s':>10} {'match s':>8} {'cpu s':>6} "
        f"{'MB/s':>6} {'ratio224':>8} {'tree MB':>8}  goal"
    )
    print(header)
    print("-" * len(header))
    failed = []
    for name in args.shapes.split(","):
        plain = repeated_file(shape_file(name, int(args.size)), args.repeat)
        for log in (plain,) if args.no_gz else (plain, gz_file(plain)):
            mb = plain.stat().st_size / 1e6
            grep224 = best([grep_run(SHARED_PATTERNS, log) for _ in range(args.runs)])
            own = best([grep_run(own_patterns, log) for _ in range(args.runs)])
            timed = best([run_tree(match_command(log), sample_every=None) for _ in range(args.runs)])
            # memory from a run of its own: sampling a tree's smaps slows its page faults (bench/treerun.py)
            sampled = run_tree(match_command(log))
            match = TreeRun(
                timed.wall, timed.cpu, sampled.peak_mb, timed.output, timed.returncode or sampled.returncode
            )
            label = name + (".gz" if log.suffix == ".gz" else "")
            speed = mb / match.wall
            ok = match.returncode == 0 and speed >= GOAL_MB_S and match.peak_mb < GOAL_TREE_MB
            if not ok:
                failed.append(label)
            print(
                f"{label:<20} {mb:>6.0f} {grep224.wall:>9.2f} {own.wall:>10.2f} {match.wall:>8.2f} {match.cpu:>6.2f} "
                f"{speed:>6.0f} {match.wall / grep224.wall:>8.2f} {match.peak_mb:>8.0f}  "
                f"{'ok' if ok else 'MISSED' if match.returncode == 0 else f'EXIT {match.returncode}'}",
                flush=True,
            )
    print(
        f"goals: >= {GOAL_MB_S} MB/s and < {GOAL_TREE_MB} MB tree memory: "
        + (f"missed on {', '.join(failed)}" if failed else "all met")
    )


if __name__ == "__main__":
    main()

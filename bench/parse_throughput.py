"""Parse throughput against grep, on the same file in the same run.

    python bench/parse_throughput.py [--size 1GiB] [--log PATH] [--runs 3]

Makes (or takes) a realistic serving log, then times `wc -l`, `grep -c -E -f <patterns>` with the
patterns the parser and the knowledge base look for, `dispatchlab parse` and `dispatchlab match`;
prints MB/s, the ratio parse/grep, and peak RSS, also for a 100 MB prefix to show memory stays flat.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, PYTHON, log_from_args, median_run

from dispatchlab.core.rules import RULES
from dispatchlab.core.signatures import load_knowledge_base


def to_ere(pattern: str) -> str:
    """Python regex -> POSIX ERE for grep -E (what the parser matches, in grep's dialect)."""
    pattern = re.sub(r"^\(\?[a-z]+\)", "", pattern)
    pattern = re.sub(r"\(\?P<\w+>", "(", pattern).replace("(?:", "(")
    pattern = pattern.replace(r"\d", "[0-9]").replace(r"\s", "[[:space:]]").replace(r"\S", "[^[:space:]]")
    pattern = pattern.replace(r"\w", "[[:alnum:]_]")
    return re.sub(r"([*+?}])\?", r"\1", pattern)


def pattern_file(path: Path) -> int:
    candidates = [to_ere(p) for p in [*RULES.values(), *load_knowledge_base().patterns]]
    good = []
    for ere in candidates:
        check = subprocess.run(["grep", "-E", "-e", ere, "/dev/null"], capture_output=True)
        if check.returncode != 2:  # 2: grep could not compile it
            good.append(ere)
    path.write_text("\n".join(good) + "\n")
    return len(good)


def prefix(log: Path, size: int) -> Path:
    out = OUT / f"{log.stem}-prefix-{size}.log"
    if not out.exists():
        with log.open("rb") as src, out.open("wb") as dst:
            left = size
            while left > 0:
                block = src.read(min(left, 1 << 24))
                if not block:
                    break
                left -= len(block)
                if left <= 0:
                    block = block[: block.rfind(b"\n") + 1]
                dst.write(block)
    return out


def main() -> None:
    args, log = log_from_args(__doc__.splitlines()[0])
    mb = log.stat().st_size / 1e6
    patterns = OUT / "patterns.ere"
    count = pattern_file(patterns)
    cli = [PYTHON, "-m", "dispatchlab.core.cli"]
    env_c = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}  # grep's fastest locale, as in perf-anchors.md
    subprocess.run(
        [*cli, "parse", "--json", str(prefix(log, 1 << 20))], capture_output=True, check=True
    )  # warm caches

    rows = []
    for name, command, env in (
        ("wc -l", ["wc", "-l", str(log)], env_c),
        (f"grep -c -E -f ({count} patterns)", ["grep", "-c", "-E", "-f", str(patterns), str(log)], env_c),
        ("dispatchlab parse --json", [*cli, "parse", "--json", str(log)], None),
        ("dispatchlab match --json", [*cli, "match", "--json", str(log)], None),
    ):
        seconds, rss = median_run(command, args.runs, env=env)
        rows.append((name, seconds, rss))
    print(f"log: {log} ({mb:,.0f} MB), median of {args.runs} runs, page cache warm")
    print(f"{'command':<34} {'seconds':>8} {'MB/s':>8} {'peak RSS MB':>12}")
    for name, seconds, rss in rows:
        print(f"{name:<34} {seconds:>8.2f} {mb / seconds:>8.0f} {rss:>12.0f}")
    grep_s = rows[1][1]
    print(
        f"ratio parse/grep: {rows[2][1] / grep_s:.2f}   ratio match/grep: {rows[3][1] / grep_s:.2f}  (<= 1.0: no slower than grep)"
    )
    small = prefix(log, 100 * 1000 * 1000)
    _, small_rss = median_run([*cli, "match", "--json", str(small)], 1)
    print(f"peak RSS of match: {small_rss:.0f} MB at 100 MB, {rows[3][2]:.0f} MB at {mb:,.0f} MB")


if __name__ == "__main__":
    main()

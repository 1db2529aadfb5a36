"""Parse throughput against grep, on the same file in the same run.

    python bench/parse_throughput.py [--size 1GiB] [--log PATH] [--runs 3]

Makes (or takes) a realistic serving log, then times `grep -c -E -f <patterns>` (every rule and
knowledge-base pattern, in grep's dialect, output to a file so grep reads the whole log) and
`dispatchlab match --json` on the whole log and on a 100 MB prefix. Prints wall and CPU seconds (the
parser uses every core, grep one), the ratio match/grep (<= 1.0: no slower than grep), the start-up time
on a one-line log, the peak memory of the whole process tree (forked scan workers counted), and where an
in-process parse spends its time, stage by stage.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, PYTHON, log_from_args
from startup import startup_figures, startup_line
from treerun import TreeRun, run_tree

from dispatchlab.core.parse.rules import RULES
from dispatchlab.core.signatures import load_knowledge_base

GREP_ENV = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}  # grep's fastest locale, as in perf-anchors.md


def _caseless(pattern: str) -> str:
    """`(?i)abc` for grep -E without -i (one grep pass for all patterns): [aA][bB][cC] outside classes."""
    out: list[str] = []
    in_class = escaped = False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        elif char.isalpha() and not in_class:
            out.append(f"[{char.lower()}{char.upper()}]")
        else:
            out.append(char)
    return "".join(out)


def to_ere(pattern: str) -> str:
    """Python regex -> POSIX ERE for grep -E (what the parser matches, in grep's dialect)."""
    flags = re.match(r"^\(\?([a-z]+)\)", pattern)
    if flags:
        pattern = pattern[flags.end() :]
    pattern = re.sub(r"\(\?P<\w+>", "(", pattern).replace("(?:", "(")
    if flags and "i" in flags.group(1):
        pattern = _caseless(pattern)
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


def grep_command(patterns: Path, log: Path) -> list[str]:
    return ["grep", "-c", "-E", "-f", str(patterns), str(log)]


def match_command(log: Path) -> list[str]:
    return [PYTHON, "-m", "dispatchlab.core.cli", "match", "--json", str(log)]


def median(command: list[str], runs: int, env: dict[str, str] | None = None) -> TreeRun:
    results = [run_tree(command, env=env) for _ in range(runs)]
    if any(r.returncode not in (0, 1) or not r.output for r in results):  # grep -c exits 1 on no match
        raise SystemExit(f"{command[0]} failed or printed nothing")
    best = sorted(results, key=lambda r: r.wall)[len(results) // 2]
    return TreeRun(best.wall, best.cpu, max(r.peak_mb for r in results), best.output, best.returncode)


def stages(log: Path) -> dict[str, float]:
    """Seconds per stage of one in-process parse + match (workers as configured)."""
    from dispatchlab.core.matching import diagnose
    from dispatchlab.core.parse import scan as scan_module
    from dispatchlab.core.parse.extra import ExtraPatterns
    from dispatchlab.core.parse.interpret import interpret
    from dispatchlab.core.parse.rules import compiled_rules
    from dispatchlab.core.parse.sources import scan_sources
    from dispatchlab.core.reading import open_sources

    kb = load_knowledge_base()
    rules = compiled_rules(ExtraPatterns(tuple(kb.patterns)))
    extract = 0.0
    feed = scan_module.Scan.feed

    def timed_feed(self: scan_module.Scan, scan: scan_module.ChunkScan) -> None:
        nonlocal extract
        began = time.perf_counter()
        feed(self, scan)
        extract += time.perf_counter() - began

    scan_module.Scan.feed = timed_feed  # type: ignore[method-assign]
    try:
        began = time.perf_counter()
        obs = scan_sources(open_sources([log]), rules)
        scanned = time.perf_counter() - began
    finally:
        scan_module.Scan.feed = feed  # type: ignore[method-assign]
    began = time.perf_counter()
    parsed = interpret(obs)
    interpreted = time.perf_counter() - began
    began = time.perf_counter()
    diagnose(parsed, kb).to_dict()
    matched = time.perf_counter() - began
    return {
        "scan: read + prefilter + line split (waiting on workers)": scanned - extract,
        "extractors (rule hits -> Observations)": extract,
        "interpret (Observations -> ParsedLog)": interpreted,
        "match + document": matched,
    }


def main() -> None:
    args, log = log_from_args(__doc__.splitlines()[0])
    patterns = OUT / "patterns.ere"
    count = pattern_file(patterns)
    print(
        f"patterns: {count} ({len(RULES)} rules + knowledge base), cores: {os.cpu_count()}, median of {args.runs} runs"
    )
    print(startup_line(startup_figures(5)))
    print(f"{'log':>10} {'command':<26} {'wall s':>7} {'cpu s':>7} {'MB/s':>7} {'tree MB':>8}")
    for target in (prefix(log, 100 * 1000 * 1000), log):
        mb = target.stat().st_size / 1e6
        grep = median(grep_command(patterns, target), args.runs, env=GREP_ENV)
        match = median(match_command(target), args.runs)
        for name, run in (("grep -c -E -f (to a file)", grep), ("dispatchlab match --json", match)):
            print(
                f"{mb:>8.0f}MB {name:<26} {run.wall:>7.2f} {run.cpu:>7.2f} {mb / run.wall:>7.0f} {run.peak_mb:>8.0f}"
            )
        print(
            f"{mb:>8.0f}MB ratio match/grep: {match.wall / grep.wall:.2f}  (grep counted {int(grep.output)} lines)"
        )
    print(f"where the time goes ({log.stat().st_size / 1e6:,.0f} MB, in-process):")
    for stage, seconds in stages(log).items():
        print(f"  {stage:<58} {seconds:>6.2f} s")


if __name__ == "__main__":
    main()

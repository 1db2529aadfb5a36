"""What each of the parse's accelerators buys, each against the standard library doing the same work.

    python bench/accelerators.py [--runs 5]

On the generated 100 MB launch log and traceback flood of bench/shapes.py (under bench/out/shapes/), in this
process, each figure the least CPU time of --runs:
- counting: every newline and `Decode batch` line of the launch log, 4 MB at a time, `bytes.count` (the
  reference) against `bytecount.counter` (StringZilla where installed);
- decompressing: the launch log's .gz read whole by the standard `gzip` (the reference) against
  `reading.gzip_module()` (ISA-L where installed);
- compiling: every rule and knowledge-base pattern with `re.compile` (the reference) against
  `compiledre.compile` from its cache (warmed first);
- frame runs: the traceback flood's runs of frame lines tested for the marks that send them the long way,
  a substring test of each piece (the reference) against `framelines._marks().of` (one Hyperscan scan).
Each line prints both times and the ratio accelerated / reference (under 1: faster).
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from log_shapes import gz_file, shape_file

from dispatchlab.core import bytecount, compiledre
from dispatchlab.core.parse import parallelscan
from dispatchlab.core.parse.extra import ExtraPatterns
from dispatchlab.core.parse.framelines import MARK_KINDS, _marks, frame_plans
from dispatchlab.core.parse.rules import compiled_rules
from dispatchlab.core.reading import gzip_module
from dispatchlab.core.signatures import load_knowledge_base

CHUNK = 4 * 1024 * 1024


def least_cpu(work: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def line(what: str, reference: float, accelerated: float, by: str) -> str:
    return (
        f"{what:<44} reference {reference * 1000:8.1f} ms   {by:<22} {accelerated * 1000:8.1f} ms"
        f"   ratio {accelerated / reference:5.2f}"
    )


def counting(launch: Path, runs: int) -> str:
    data = launch.read_bytes()
    chunks = [data[at : at + CHUNK] for at in range(0, len(data), CHUNK)]

    def plain() -> None:
        for chunk in chunks:
            chunk.count(b"\n"), chunk.count(b"Decode batch")

    def accelerated() -> None:
        for chunk in chunks:
            count = bytecount.counter(chunk)
            count(b"\n"), count(b"Decode batch")

    by = "StringZilla" if bytecount._enabled() else "bytes.count (none)"
    return line(
        "count newlines + statistics lines, 100 MB", least_cpu(plain, runs), least_cpu(accelerated, runs), by
    )


def decompressing(launch_gz: Path, runs: int) -> str:
    def read_with(module: object) -> Callable[[], None]:
        def read() -> None:
            with module.open(launch_gz, "rb") as stream:  # type: ignore[attr-defined]
                while stream.read(CHUNK):
                    pass

        return read

    module = gzip_module()
    by = "ISA-L" if module.__name__ == "isal.igzip" else "gzip (no ISA-L)"
    return line(
        "decompress the 100 MB launch log's .gz",
        least_cpu(read_with(gzip), runs),
        least_cpu(read_with(module), runs),
        by,
    )


def compiling(runs: int) -> str:
    patterns = compiled_rules(ExtraPatterns(tuple(load_knowledge_base().patterns))).scanner.patterns
    for pattern in patterns:
        compiledre.compile(pattern)  # the cache warm, as after a first run

    def plain() -> None:
        for pattern in patterns:
            re.purge()  # past re's own cache: a new process compiles every pattern
            re.compile(pattern)

    def cached() -> None:
        for pattern in patterns:
            compiledre.compile(pattern)

    return line(
        f"compile the {len(patterns)} rules and KB patterns",
        least_cpu(plain, runs),
        least_cpu(cached, runs),
        "compiledre (cache)",
    )


def frame_runs(flood: Path, runs: int) -> str:
    rules = compiled_rules(ExtraPatterns(tuple(load_knowledge_base().patterns)))
    plans = frame_plans(rules.names)
    size = flood.stat().st_size
    joined: list[bytes] = []
    for segment in parallelscan._segments(flood, size, None)[:6]:
        for scan in parallelscan.scan_segment(rules.scanner, flood, segment, 1 << 30):
            number = 0
            while number < len(scan):
                end = number
                while end < len(scan) and scan.rule_sets[scan.hit_rules[end]] in plans:
                    end += 1
                if end - number > 1:
                    begin = scan.hit_ends[number - 1] if number else 0
                    joined.append(scan.hit_text[begin : scan.hit_ends[end - 1]])
                number = max(end, number + 1)
    pieces = [(kind, piece.encode()) for kind, kind_pieces in MARK_KINDS.items() for piece in kind_pieces]
    marks = _marks()

    def plain() -> None:
        for text in joined:
            {kind for kind, piece in pieces if piece in text}

    def scanned() -> None:
        for text in joined:
            marks.of(text)

    by = "one Hyperscan scan" if marks.scanner is not None else "piece by piece (none)"
    return line(
        f"marks of {len(joined):,} runs of frame lines", least_cpu(plain, runs), least_cpu(scanned, runs), by
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    size = 100_000_000
    launch = shape_file("launch", size)
    launch_gz = gz_file(launch)
    flood = shape_file("traceback_flood", size)
    print(counting(launch, args.runs))
    print(decompressing(launch_gz, args.runs))
    print(compiling(args.runs))
    print(frame_runs(flood, args.runs))


if __name__ == "__main__":
    main()

"""What the Hyperscan pass costs with the rules' gates, against the rules as written, on 16 MB of each shape.

    python bench/hyperscan_gates.py [--shapes launch,crash_loop,traceback_flood] [--runs 5]

Three databases of the same rules and knowledge-base patterns, each scanned over the first 16 MB of a
generated shape (bench/shapes.py, 100 MB files under bench/out/shapes/), in this process: the reference,
every rule as written (no gates); as shipped (the gates of rules.GATES in their rules' place); and as shipped
without the two rules that have no literal to look for (`gen_words`, `gen_repeat`), to show what they cost.
Each figure is the least CPU time of --runs calls of `Scanner.lines` (the scan and the parse's walk over its\nmatches, one per rule and line), and its ratio to the reference's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from log_shapes import shape_file

from dispatchlab.core.parse.rules import GATES, RULES
from dispatchlab.core.parse.scanner import Scanner, hyperscan_enabled
from dispatchlab.core.signatures import load_knowledge_base

SAMPLE_BYTES = 16 * 1024 * 1024
LITERAL_FREE = ("gen_words", "gen_repeat")


def scan_ms(scanner: Scanner, text: bytes, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.process_time()
        scanner.lines(text)
        best = min(best, time.process_time() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="launch,crash_loop,traceback_flood")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not hyperscan_enabled():
        raise SystemExit("Hyperscan is not installed: nothing to measure")
    names = list(RULES)
    patterns = [*RULES.values(), *load_knowledge_base().patterns]
    gates = [GATES.get(name) for name in names]
    kept = [i for i, name in enumerate(names) if name not in LITERAL_FREE] + list(
        range(len(names), len(patterns))
    )
    databases = {
        "as written": Scanner(patterns),
        "gated": Scanner(patterns, gates),
        "gated, no gen_words/gen_repeat": Scanner(
            [patterns[i] for i in kept], [gates[i] if i < len(gates) else None for i in kept]
        ),
    }
    print(
        f"{len(patterns)} patterns, {len(GATES)} gated ({', '.join(sorted(GATES))}); CPU ms per 16 MB, least of {args.runs}"
    )
    print(f"{'shape':<16} " + " ".join(f"{label:>32}" for label in databases))
    for shape in args.shapes.split(","):
        with shape_file(shape, 100 * 1000 * 1000).open("rb") as handle:
            text = handle.read(SAMPLE_BYTES)
        text = text[: text.rfind(b"\n") + 1]
        figures = [scan_ms(scanner, text, args.runs) for scanner in databases.values()]
        cells = [f"{ms:>7.1f} ms ({ms / figures[0]:4.2f}x)" for ms in figures]
        print(f"{shape:<16} " + " ".join(f"{cell:>32}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()

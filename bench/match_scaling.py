"""Matching cost against the number of signatures: the real knowledge base vs one 10x larger.

    python bench/match_scaling.py [--size 1GiB] [--log PATH] [--runs 3]

The larger set holds every real signature plus nine variations of each (its patterns with the longest
literal changed, so they look like signatures for neighbouring versions or kernels and rarely fire).
Both run on the same log in this process; the Hyperscan databases are compiled before timing.
"""

from __future__ import annotations

import copy
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import log_from_args
from dispatchlab.core.parser import _parser_for

from dispatchlab.core.matching import analyze_sources
from dispatchlab.core.reading import open_sources
from dispatchlab.core.signatures import KnowledgeBase, Signature, load_knowledge_base

_LITERAL = re.compile(r"[A-Za-z][A-Za-z ]{5,}")


def _vary(pattern: str, n: int) -> str:
    m = max(_LITERAL.finditer(pattern), key=lambda x: len(x.group(0)), default=None)
    if m is None:
        return pattern + f"(?:variant{n})"
    word = m.group(0)
    return pattern[: m.start()] + f"{word[:3]}{n}x{word[3:]}" + pattern[m.end() :]


def enlarged(kb: KnowledgeBase, factor: int) -> KnowledgeBase:
    signatures: list[Signature] = [copy.copy(s) for s in kb.signatures]
    for n in range(1, factor):
        for sig in kb.signatures:
            clone = copy.copy(sig)
            clone.id = f"{sig.id}-v{n}"
            clone.any_patterns = [_vary(p, n) for p in sig.any_patterns]
            clone.all_patterns = [_vary(p, n) for p in sig.all_patterns]
            clone.sequence = [_vary(p, n) for p in sig.sequence]
            signatures.append(clone)
    return KnowledgeBase.from_signatures(signatures, kb.digest + f"x{factor}")


def timed(log: Path, kb: KnowledgeBase, runs: int) -> float:
    _parser_for(tuple(kb.patterns))  # compile outside the timing
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        analyze_sources(open_sources([log]), kb=kb)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    args, log = log_from_args(__doc__.splitlines()[0])
    real = load_knowledge_base()
    big = enlarged(real, 10)
    mb = log.stat().st_size / 1e6
    base = timed(log, real, args.runs)
    large = timed(log, big, args.runs)
    print(f"log: {log} ({mb:,.0f} MB), median of {args.runs} runs")
    print(
        f"real set:  {len(real.signatures):>4} signatures, {len(real.patterns):>5} patterns: {base:6.2f} s ({mb / base:,.0f} MB/s)"
    )
    print(
        f"10x set:   {len(big.signatures):>4} signatures, {len(big.patterns):>5} patterns: {large:6.2f} s ({mb / large:,.0f} MB/s)"
    )
    print(f"time ratio 10x/real: {large / base:.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()

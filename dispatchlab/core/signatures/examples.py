"""`dispatchlab kb test`: every signature against its own examples, through the real parser."""

from __future__ import annotations

import io
from pathlib import Path

from dispatchlab.core.matching import apply_fact_overrides, log_facts, match_signatures
from dispatchlab.core.parse import ExtraPatterns, parse_sources
from dispatchlab.core.reading import Source
from dispatchlab.core.signatures import KnowledgeBase, Signature, load_knowledge_base


def _source(text: str, name: str) -> Source:
    data = text.strip("\n").encode("utf-8") + b"\n"
    return Source(name, lambda: io.BytesIO(data), len(data))


def example_matches(signature: Signature, kb: KnowledgeBase, log: str, facts: dict[str, object]) -> bool:
    parsed = parse_sources([_source(log, f"{signature.id} example")], extra=ExtraPatterns(tuple(kb.patterns)))
    merged = apply_fact_overrides(log_facts(parsed), dict(facts))
    return bool(match_signatures(parsed, parsed.pattern_hits, kb, only=[signature], facts=merged))


def run_examples(directory: Path | None = None) -> tuple[list[str], int]:
    kb = load_knowledge_base(directory)
    failures: list[str] = []
    count = 0
    for signature in kb.signatures:
        for i, example in enumerate(signature.examples):
            count += 1
            matched = example_matches(signature, kb, example.log, example.facts)
            if matched != (example.expect == "match"):
                verb = "did not match" if example.expect == "match" else "matched"
                failures.append(f"{signature.path}: example[{i}] ({example.expect}) {verb}")
    return failures, count

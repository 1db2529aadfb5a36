"""The fast path and the fallback must agree: same documents with and without Hyperscan, and the
routine lines the fallback skips never match a rule."""

from __future__ import annotations

import os
import re

import pytest

from dispatchlab.core.matching import diagnose
from dispatchlab.core.parse import scanner as scanner_module
from dispatchlab.core.parse.extra import ExtraPatterns
from dispatchlab.core.parse.interpret import interpret
from dispatchlab.core.parse.rules import RULES, CompiledRules
from dispatchlab.core.parse.sources import scan_sources
from dispatchlab.core.reading import open_sources
from dispatchlab.core.signatures import load_knowledge_base

from .helpers import LOGS

ROUTINE_LINES = [
    "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 8, #token: 4400, token usage: 0.01, cuda graph: True, gen throughput (token/s): 512.33, #queue-req: 0, ",
    "[2026-01-01 00:00:00 DP1 TP3 EP3] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ",
    '[2026-01-01 00:00:00] INFO:     10.0.0.1:41234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "INFO 09-14 10:21:03 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 41.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%",
]


def test_routine_lines_never_match_a_rule_or_a_signature_pattern():
    patterns = [*RULES.values(), *load_knowledge_base().patterns]
    for line in ROUTINE_LINES:
        assert scanner_module.ROUTINE.match(line.encode()), line
        hits = [p for p in patterns if re.search(p, line)]
        assert hits == [], f"{line[:60]}... matches {hits}"


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_hyperscan_and_the_pure_python_fallback_give_the_same_diagnosis(name, monkeypatch):
    if not scanner_module.hyperscan_enabled():
        if os.environ.get("DISPATCHLAB_CI"):
            pytest.fail("Hyperscan is not installed: CI must compare it with the fallback")
        pytest.skip("Hyperscan is not installed here")
    kb = load_knowledge_base()
    extra = ExtraPatterns(tuple(kb.patterns))
    fast_rules = CompiledRules(extra)
    assert fast_rules.scanner.db is not None
    fast = diagnose(interpret(scan_sources(open_sources([LOGS / name]), fast_rules)), kb).to_dict()
    monkeypatch.setenv("DISPATCHLAB_NO_HYPERSCAN", "1")
    slow_rules = CompiledRules(extra)
    assert slow_rules.scanner.db is None
    slow = diagnose(interpret(scan_sources(open_sources([LOGS / name]), slow_rules)), kb).to_dict()
    assert fast == slow


def test_a_cached_database_finds_what_a_fresh_compile_finds(tmp_path, monkeypatch):
    if not scanner_module.hyperscan_enabled():
        pytest.skip("Hyperscan is not installed here")
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path))
    chunk = (LOGS / "sglang_dsv4_eagle_sm120.log").read_bytes()
    fresh = scanner_module.Scanner(list(RULES.values()))
    assert list(tmp_path.glob("hs-*.db")), "the compiled database was not cached"
    cached = scanner_module.Scanner(list(RULES.values()))
    assert cached.candidates(chunk) == fresh.candidates(chunk) != {}

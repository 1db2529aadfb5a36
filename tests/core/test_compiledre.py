"""Regexes compiled once per machine (dispatchlab.core.compiledre): a pattern made from the cached compiler
output finds what `re.compile` finds, a second process reads the cache instead of compiling, and a damaged
cache costs only the compile."""

from __future__ import annotations

import marshal
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchlab.core import compiledre
from dispatchlab.core.parse.extra import ExtraPatterns
from dispatchlab.core.parse.rules import compiled_rules
from dispatchlab.core.signatures import load_knowledge_base

from .helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiledre, "_stored", None)
    monkeypatch.setattr(compiledre, "_added", {})
    return tmp_path


def _rule_patterns() -> list[str]:
    rules = compiled_rules(ExtraPatterns(tuple(load_knowledge_base().patterns)))
    return list(rules.scanner.patterns)


def _fixture_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted(FIXTURES.rglob("*.log")):
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()[:60]
    return lines[:4000]


def test_every_rule_made_from_the_cache_matches_what_re_compile_matches(fresh_cache: Path) -> None:
    patterns = _rule_patterns()
    for pattern in patterns:
        compiledre.compile(pattern)
    compiledre._save()
    compiledre._stored, compiledre._added = None, {}
    assert len(compiledre._entries()) >= len(set(patterns))  # all read back from the file
    lines = _fixture_lines()
    assert len(lines) == 4000
    for pattern in patterns:
        cached, plain = compiledre.compile(pattern), re.compile(pattern)
        assert (cached.pattern, cached.flags, cached.groups, cached.groupindex) == (
            plain.pattern,
            plain.flags,
            plain.groups,
            plain.groupindex,
        )
        for line in lines:
            found, expected = cached.search(line), plain.search(line)
            assert (found and (found.span(), found.groups())) == (
                expected and (expected.span(), expected.groups())
            )
    assert not compiledre._added  # nothing compiled anew: every pattern came from the file


def test_flags_and_bytes_patterns_keep_their_meaning(fresh_cache: Path) -> None:
    caseless = compiledre.compile(r"cuda error: (?P<what>.+)", re.IGNORECASE)
    assert caseless.search("CUDA ERROR: out of memory").group("what") == "out of memory"
    routine = compiledre.compile(rb"^Decode batch\b", re.MULTILINE)
    assert routine.findall(b"x\nDecode batch. #running-req: 1\n") == [b"Decode batch"]


def test_a_second_process_reads_the_cache_and_a_damaged_one_is_compiled_again(tmp_path: Path) -> None:
    script = (
        "from dispatchlab.core import compiledre\n"
        "m = compiledre.compile(r'(?P<exc>\\w+Error): (?P<msg>.*)')\n"
        "assert m.search('x RuntimeError: boom').group('exc', 'msg') == ('RuntimeError', 'boom')\n"
        "print(len(compiledre._added))\n"
    )
    env = {**os.environ, "DISPATCHLAB_CACHE_DIR": str(tmp_path)}

    def run() -> str:
        return subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert run() == "1"  # compiled, and written at exit
    (cache,) = tmp_path.glob("re-*.marshal")
    written = cache.read_bytes()
    assert len(marshal.loads(written[compiledre._DIGEST :])) == 1
    assert run() == "0"  # made from the file
    cache.write_bytes(b"\x00 not marshal")
    assert run() == "1"  # the damaged file only costs the compile
    # a flipped byte that still loads (a literal of the pattern's code) is noticed, not made into a pattern
    # that matches something else run after run
    flipped = bytearray(cache.read_bytes())
    flipped[len(flipped) - 40] ^= 0x01
    cache.write_bytes(bytes(flipped))
    assert run() == "1"


def test_the_cache_holds_a_bounded_number_of_patterns(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiledre, "_MAX_ENTRIES", 50)
    patterns = [f"user signature {n}: (?P<x>\\d+)" for n in range(80)]
    for pattern in patterns:
        assert compiledre.compile(pattern).search(pattern.split(":")[0] + ": 7") is not None
    assert len(compiledre._added) == 50
    compiledre._save()
    compiledre._stored, compiledre._added = None, {}
    assert len(compiledre._entries()) == 50

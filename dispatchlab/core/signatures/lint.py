"""`dispatchlab kb lint`: beyond loading (which validates types, regexes, classes), check what a reviewer
would: examples on both sides, engine-friendly patterns, and fixes that use real flags and valid values."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from dispatchlab.core.signatures import Signature, SignatureError, load_signature, signature_files
from dispatchlab.core.versions import SpecifierSet, Version

CATALOG_DIR = Path(__file__).resolve().parent.parent / "data"


@lru_cache(maxsize=1)
def flag_catalogs() -> dict[str, dict[str, dict[str, Any]]]:
    """{server: {version: {flag: spec}}} from dispatchlab/core/data/flags-<server>.json."""
    catalogs: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(CATALOG_DIR.glob("flags-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        catalogs[data.get("server", path.stem.removeprefix("flags-"))] = data.get("versions", {})
    return catalogs


def _top_level_branches(pattern: str) -> list[str]:
    branches, depth, current, i = [], 0, [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            current.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[":
            end = pattern.find("]", i + 2)
            end = len(pattern) - 1 if end < 0 else end
            current.append(pattern[i : end + 1])
            i = end + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            branches.append("".join(current))
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    branches.append("".join(current))
    return branches


def _longest_literal(pattern: str) -> int:
    """Length of the shortest 'longest literal run' over the top-level branches: a prefilter needs one per branch."""
    body = re.sub(r"^\(\?[a-z]+\)", "", pattern)
    shortest = None
    for branch in _top_level_branches(body):
        stripped = re.sub(r"\[(?:\\.|[^\]])*\]|\(\?(?:P<\w+>|:)|\\[dswbDSWB]|\{\d*,?\d*\}", "\x00", branch)
        runs = re.findall(r"(?:\\[^dswbDSWB]|[^.^$*+?{}\[\]\\|()\x00])+", stripped)
        best = max((len(re.sub(r"\\(.)", r"\1", run)) for run in runs), default=0)
        shortest = best if shortest is None else min(shortest, best)
    return shortest or 0


# Words too common to show that a negative example is a near miss of the pattern it sits next to.
_STOPWORDS = frozenset(
    {"this", "that", "with", "from", "have", "been", "does", "only", "than", "will", "when"}
)


def _literal_runs(pattern: str) -> list[str]:
    """The literal text of a pattern, in runs cut at every regex construct (escapes resolved)."""
    body = re.sub(r"^\(\?[a-z]+\)", "", pattern)
    stripped = re.sub(r"\[(?:\\.|[^\]])*\]|\(\?(?:P<\w+>|:)|\\[dswbDSWBn]|\{\d*,?\d*\}", "\x00", body)
    runs = re.findall(r"(?:\\[^dswbDSWBn]|[^.^$*+?{}\[\]\\|()\x00])+", stripped)
    return [re.sub(r"\\(.)", r"\1", run) for run in runs]


def near_miss_fragments(patterns: list[str]) -> set[str]:
    """Lower-cased text a near miss shares with the patterns: each word of 4+ characters of their literal
    parts; for a pattern without such words (a run of `!`), the first half of its longest literal."""
    fragments: set[str] = set()
    for pattern in patterns:
        runs = _literal_runs(pattern)
        words = {
            word.lower()
            for run in runs
            for word in re.findall(r"[A-Za-z0-9_]{4,}", run)
            if word.lower() not in _STOPWORDS
        }
        if not words and runs:
            longest = max(runs, key=len).strip()
            words = {longest[: max(2, len(longest) // 2)].lower()} if longest else set()
        fragments |= words
    return fragments


def check_negative_examples_are_near_misses(signature: Signature) -> list[str]:
    """A `no_match` example that shares no text with the patterns would pass whatever they say: it tests
    nothing. Each must hold a near miss (the same words in a harmless line, or a matching line whose facts
    the conditions reject)."""
    fragments = near_miss_fragments(signature.patterns)
    return [
        f"{signature.path}: example[{index}]: the no_match example shares no word with the patterns, "
        "so it cannot fail; make it a near miss"
        for index, example in enumerate(signature.examples)
        if example.expect == "no_match" and not any(f in example.log.lower() for f in fragments)
    ]


def _versions_for(signature: Signature, server: str, versions: dict[str, Any]) -> list[str]:
    """The catalog versions the signature applies to, newest first."""
    spec = signature.conditions.get("versions", {}).get(server)
    chosen = [v for v in versions if not spec or SpecifierSet(spec).contains(v)] or list(versions)
    return sorted(chosen, key=Version, reverse=True)


def check_fix_flags(signature: Signature) -> list[str]:
    """Each fix flag must be a real flag of a server the signature applies to, and its value a valid
    choice in the newest release (within the signature's version range) that has the flag."""
    problems: list[str] = []
    servers = [
        s
        for s in signature.conditions.get("server_in") or ["sglang", "vllm"]
        if s not in signature.fix_by_server
    ]
    # every server has its own variant: the default args serve a log whose server is unknown
    checks = [(servers or ["sglang", "vllm"], signature.fix_args, "fix.args")]
    checks += [
        ([server], variant.args, f"fix.by_server.{server}.args")
        for server, variant in signature.fix_by_server.items()
    ]
    for servers, args, where in checks:
        problems.extend(_check_args(signature, servers, args, where))
    return problems


def _check_args(signature: Signature, servers: list[str], args: dict[str, Any], where: str) -> list[str]:
    problems: list[str] = []
    catalogs = flag_catalogs()
    for flag, value in args.items():
        known = False
        for server in servers:
            versions = catalogs.get(server)
            if not versions:
                known = True  # no catalog for this server yet: nothing to check against
                continue
            newest = next(
                (v for v in _versions_for(signature, server, versions) if flag in versions[v]), None
            )
            if newest is None:
                continue
            known = True
            choices = versions[newest][flag].get("choices")
            valued = value not in (True, False) and not isinstance(value, (int, float))
            if choices and valued and str(value) not in [str(c) for c in choices]:
                problems.append(
                    f"{signature.path}: {where}.{flag}: {value!r} is not a valid choice in {server} {newest} "
                    f"({', '.join(map(str, choices[:12]))})"
                )
        if not known:
            problems.append(
                f"{signature.path}: {where}.{flag}: not a flag of {' or '.join(servers)} in the catalog"
            )
    return problems


def lint_signature(signature: Signature) -> list[str]:
    problems: list[str] = []
    expects = {e.expect for e in signature.examples}
    if "match" not in expects:
        problems.append(f"{signature.path}: example: needs at least one `match` example")
    if "no_match" not in expects:
        problems.append(f"{signature.path}: example: needs at least one `no_match` example")
    for pattern in signature.patterns:
        if pattern.startswith((".*", "(?i).*")):
            problems.append(f"{signature.path}: match: pattern {pattern!r} starts with .*")
        if "(?=" in pattern or "(?!" in pattern or "(?<" in pattern.replace("(?P<", ""):
            problems.append(f"{signature.path}: match: pattern {pattern!r} uses lookaround")
        if _longest_literal(pattern) < 6:
            problems.append(
                f"{signature.path}: match: pattern {pattern!r} has a branch without a 6-character literal"
            )
    if not signature.explanation.strip() or not signature.fix_summary.strip():
        problems.append(f"{signature.path}: explanation/fix.summary: must not be empty")
    problems.extend(check_fix_flags(signature))
    problems.extend(check_negative_examples_are_near_misses(signature))
    return problems


def check_supersedes(signatures: dict[str, Signature]) -> list[str]:
    return [
        f"{sig.path}: supersedes: {target!r} is not a signature id"
        for sig in signatures.values()
        for target in sig.supersedes
        if target not in signatures
    ]


def lint_knowledge_base(directory: Path | None = None) -> tuple[list[str], int]:
    from dispatchlab.core.signatures import DATA_DIR

    problems: list[str] = []
    seen: dict[str, str] = {}
    loaded: dict[str, Signature] = {}
    files = signature_files(directory or DATA_DIR)
    for path in files:
        try:
            signature = load_signature(path)
        except SignatureError as error:
            problems.append(str(error))
            continue
        if signature.id in seen:
            problems.append(f"{path}: id: duplicate of {seen[signature.id]}")
        seen[signature.id] = str(path)
        problems.extend(lint_signature(signature))
        loaded[signature.id] = signature
    problems.extend(check_supersedes(loaded))
    return problems, len(files)

"""Matching the knowledge base against a parsed log: one pass for all signatures, then conditions on facts.

The scan runs every signature pattern in its multi-pattern engine (`ExtraPatterns`) and keeps the hits;
here each signature's any / all / sequence logic and conditions run on those hits. When no signature
explains a failure, the class is inferred from the log (`inference.py`), so `other` is what remains when
nothing fits and `none` only when nothing failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dispatchlab.core.diagnosis import Diagnosis, Evidence, Fix, Match
from dispatchlab.core.fallback import (
    SERVING,
    FallbackClass,
    Model,
    decision_kind,
    fallback_class,
    features,
    load_model,
)
from dispatchlab.core.flags import fix_args_for_server
from dispatchlab.core.inference import classify, fingerprint
from dispatchlab.core.parse import ExtraPatterns, ProgressCallback, parse_sources
from dispatchlab.core.parse.interpret.crash import crash_from_fatal_line
from dispatchlab.core.parse.model import ParsedLog, PatternHit
from dispatchlab.core.parse.vocabulary import VERSION_KEYS
from dispatchlab.core.reading import Source
from dispatchlab.core.records import record
from dispatchlab.core.signatures import KnowledgeBase, Signature, load_knowledge_base
from dispatchlab.core.versions import SpecifierSet

if TYPE_CHECKING:
    from dispatchlab.core.lineindex import LineIndexWriter

Hits = dict[int, list[PatternHit]]
# the rules' classes the learned fallback may replace: nothing explained the failure, or nothing failed
FALLBACK_FOR = ("other", "none", "cuda_graph_capture_failure")

# a `none` less likely right than this, on a log that never shows the server answering, is flagged low-confidence
DOUBTFUL_NONE = 0.5


# ---------------------------------------------------------------- facts
def log_facts(parsed: ParsedLog) -> dict[str, Any]:
    """What signature conditions test: arch, server, crash phase and model, quantization, versions, ..."""
    args = parsed.server_args
    quantization = parsed.backends.get("quantization") or args.get("quantization")
    crash = parsed.crash
    return {
        "arch": parsed.gpu.arch,
        "server": parsed.server if parsed.server != "unknown" else (parsed.engine or None),
        "crash_phase": crash.phase if crash else None,
        "crash_model": crash.model if crash else None,
        "quantization": quantization if quantization not in (None, "None") else None,
        "outcome": parsed.outcome,
        "versions": {k: v for k, v in parsed.versions.items() if v},
        "backends": parsed.backends,
        "draft_backends": parsed.draft_backends,
        "server_args": args,
    }


def apply_fact_overrides(facts: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Example facts: `arch`, `server`, `crash_phase`, `crash_model`, `quantization`, `outcome`, a package
    name for its version, or dotted `backends.x` / `draft_backends.x` / `server_args.x` / `versions.x`."""
    merged = {
        **facts,
        "versions": dict(facts["versions"]),
        "backends": dict(facts["backends"]),
        "draft_backends": dict(facts["draft_backends"]),
        "server_args": dict(facts["server_args"]),
    }
    for key, value in overrides.items():
        if "." in key:
            table, name = key.split(".", 1)
            merged.setdefault(table, {})[name] = value
        elif key in VERSION_KEYS:
            merged["versions"][key] = value
        else:
            merged[key] = value
    return merged


@record
class ConditionResult:
    ok: bool
    satisfied: int
    unknown: int
    facts: dict[str, Any]


class _Conditions:
    """Counts which conditions a log's facts satisfy, and which it cannot tell (an unknown passes)."""

    def __init__(self) -> None:
        self.satisfied = 0
        self.unknown = 0
        self.shown: dict[str, Any] = {}

    def one(self, name: str, value: Any, allowed: list[Any], negate: bool = False) -> bool:
        if value in (None, "", "unknown"):
            self.unknown += 1
            return True
        inside = str(value).lower() in {str(a).lower() for a in allowed}
        if inside != negate:
            self.satisfied += 1
            self.shown[name] = value
            return True
        return False

    def version(self, package: str, have: str | None, spec: str) -> bool:
        if not have:
            self.unknown += 1
            return True
        inside = SpecifierSet(spec).contains(str(have))
        if inside is None:
            self.unknown += 1
            return True
        if inside:
            self.satisfied += 1
            self.shown[package] = have
        return inside

    def result(self, ok: bool) -> ConditionResult:
        return ConditionResult(ok, self.satisfied, self.unknown, self.shown)


_SIMPLE_CONDITIONS = {
    "arch_in": ("arch", False),
    "arch_not_in": ("arch", True),
    "server_in": ("server", False),
    "crash_phase_in": ("crash_phase", False),
    "quantization_in": ("quantization", False),
    "outcome_in": ("outcome", False),
}


def check_conditions(signature: Signature, facts: dict[str, Any]) -> ConditionResult:
    cond = signature.conditions
    check = _Conditions()
    for key, (fact, negate) in _SIMPLE_CONDITIONS.items():
        if key in cond and not check.one(fact, facts.get(fact), cond[key], negate):
            return check.result(False)
    if "crash_model" in cond and not check.one(
        "crash_model", facts.get("crash_model"), [cond["crash_model"]]
    ):
        return check.result(False)
    for package, spec in cond.get("versions", {}).items():
        if not check.version(package, facts["versions"].get(package), spec):
            return check.result(False)
    for table in ("backends", "draft_backends", "server_args"):
        for name, allowed in cond.get(table, {}).items():
            if not check.one(f"{table}.{name}", facts.get(table, {}).get(name), allowed):
                return check.result(False)
    return check.result(True)


# ---------------------------------------------------------------- line logic
def _sequence_lines(sig: Signature, hits: Hits) -> list[int] | None:
    chains: list[list[int]] = [[h.line] for h in hits.get(sig.sequence_ids[0], [])]
    for pattern_id in sig.sequence_ids[1:]:
        next_lines = sorted(h.line for h in hits.get(pattern_id, []))
        extended = []
        for chain in chains:
            nxt = next((n for n in next_lines if chain[-1] < n <= chain[-1] + sig.within), None)
            if nxt is not None:
                extended.append([*chain, nxt])
        chains = extended
        if not chains:
            return None
    return chains[0] if chains else None


def line_evidence(sig: Signature, hits: Hits) -> list[PatternHit] | None:
    """The hits that satisfy the signature's line logic, or None."""
    evidence: list[PatternHit] = []
    if sig.any_ids:
        found = [h for i in sig.any_ids for h in hits.get(i, [])]
        if not found:
            return None
        evidence.extend(found)
    for pattern_id in sig.all_ids:
        found = hits.get(pattern_id, [])
        if not found:
            return None
        evidence.extend(found[:3])
    if sig.sequence_ids:
        chain = _sequence_lines(sig, hits)
        if chain is None:
            return None
        wanted = set(chain)
        evidence.extend(h for i in sig.sequence_ids for h in hits.get(i, []) if h.line in wanted)
    return evidence


# ---------------------------------------------------------------- matching
# failures first, then known warnings; a wrapper ("the scheduler died", "the engine core failed") only says
# that something else failed, so it comes last and never decides the class
_LEVEL_RANK = {"failure": 2.0, "warning": 1.0, "wrapper": 0.0}


def crash_window(parsed: ParsedLog) -> tuple[int, int] | None:
    """The crash's lines: its traceback, and the same rank's tracebacks close by."""
    crash = parsed.crash
    if crash is None:
        return None
    end = crash.line
    for tb in parsed.tracebacks:
        if tb.line == crash.line or (tb.ranks and crash.rank in tb.ranks and abs(tb.line - crash.line) < 400):
            end = max(end, tb.end_line or tb.line)
    return crash.line, max(end, crash.line + 3)


def _confidence(sig: Signature, result: ConditionResult, lines: list[int], at_crash: bool) -> float:
    confidence = 0.6 + min(0.2, 0.05 * result.satisfied) - min(0.25, 0.08 * result.unknown)
    if at_crash:
        confidence += 0.15
    if len(sig.patterns) > 1 and len(lines) > 1:
        confidence += 0.05
    if sig.level == "warning":
        confidence = min(confidence, 0.5)
    return round(max(0.05, min(0.99, confidence)), 2)


def _match(
    sig: Signature, server: Any, evidence: list[PatternHit], result: ConditionResult, confidence: float
) -> Match:
    variant = sig.fix_by_server.get(str(server))
    captured: dict[str, Any] = {}
    for hit in evidence:
        for key, value in hit.groups.items():
            captured.setdefault(key, value)
    captured.update(result.facts)
    args, withheld = fix_args_for_server(variant.args if variant else sig.fix_args, server)
    fix = Fix(
        summary=variant.summary if variant else sig.fix_summary,
        args=args,
        env=variant.env if variant else sig.fix_env,
        tried_and_failed=[f"{t.what}: {t.why}" for t in sig.tried_and_failed],
        withheld_args=withheld,
    )
    shown = sorted(evidence, key=lambda h: h.line)[:12]
    return Match(
        id=sig.id,
        title=sig.title,
        failure_class=sig.failure_class,
        confidence=confidence,
        lines=sorted({h.line for h in evidence})[:50],
        facts=captured,
        fix=fix,
        severity=sig.severity,
        level=sig.level,
        explanation=sig.explanation,
        references=sig.references,
        evidence=[Evidence(h.line, h.rank, h.text[:500]) for h in shown],
    )


def _supersede(ordered: list[Match], signatures: Sequence[Signature]) -> list[Match]:
    """Reviewed precedence: a signature that explains another (a cause seen before the symptom) goes first."""
    superseding = {s.id: set(s.supersedes) for s in signatures if s.supersedes}
    for match in [m for m in ordered if m.id in superseding]:
        targets = [i for i, m in enumerate(ordered) if m.id in superseding[match.id]]
        if targets and targets[0] < ordered.index(match):
            ordered.remove(match)
            ordered.insert(targets[0], match)
    return ordered


def match_signatures(
    parsed: ParsedLog,
    hits: Hits,
    kb: KnowledgeBase,
    *,
    only: Sequence[Signature] | None = None,
    facts: dict[str, Any] | None = None,
) -> list[Match]:
    facts = facts if facts is not None else log_facts(parsed)
    window = crash_window(parsed)
    signatures = only if only is not None else kb.signatures
    ranked: list[tuple[tuple[float, ...], Match]] = []
    for sig in signatures:
        evidence = line_evidence(sig, hits)
        if evidence is None:
            continue
        result = check_conditions(sig, facts)
        if not result.ok:
            continue
        lines = sorted({h.line for h in evidence})
        at_crash = window is not None and any(window[0] <= n <= window[1] + 40 for n in lines)
        confidence = _confidence(sig, result, lines, at_crash)
        specificity = result.satisfied + len(sig.all_ids) + len(sig.sequence_ids)
        key = (
            _LEVEL_RANK[sig.level],
            float(at_crash),
            confidence,
            float(specificity),
            -float(lines[0]),
        )
        ranked.append((key, _match(sig, facts.get("server"), evidence, result, confidence)))
    ranked.sort(key=lambda pair: pair[0], reverse=True)
    return _supersede([m for _, m in ranked], signatures)


# ---------------------------------------------------------------- entry points
def diagnose(
    parsed: ParsedLog, kb: KnowledgeBase, *, model: Callable[[], Model | None] | None = None
) -> Diagnosis:
    """The known failures the log matches, and its class. Decision order (docs/contract.md):

    1. the best failure signature's class (the model never overrides a reviewed signature);
    2. else the terminal exception's own class (its card then comes first);
    3. else, for a failure nothing explains, a known warning's class (same figure in leave-one-source-out
       either way; the warning keeps its evidence and fix);
    4. else the learned fallback (`fallback.py`, `model` gives it; the shipped one by default), read only
       now: a class above its threshold, or `other` with low confidence and its best guesses; on a log the
       rules call `none`, only a class above its alarm threshold;
    5. without a model: `other` for a failure nothing explains, else `none`.

    Whatever decided, `class_confidence` is then the decision's raw score (the signature's or card's
    confidence, the warning's, the model's probability, the model's probability of `none`) mapped by the
    model file's calibration for that kind of decision: the share of such decisions that were right."""
    matches = match_signatures(parsed, parsed.pattern_hits, kb)
    failures = [m for m in matches if m.level == "failure"]
    learned = (model or load_model)()
    decided: FallbackClass | None = None
    confidence: float | None = None
    if failures:
        failure_class, source, class_source = failures[0].failure_class, "signature", "signature"
        confidence = failures[0].confidence
    else:
        failure_class, terminal = classify(parsed)
        source, class_source = "inferred", "rules"
        if terminal is not None:
            from dispatchlab.core.terminal import terminal_match

            matches.insert(0, terminal_match(parsed, terminal))
            class_source, confidence = "exception", matches[0].confidence
        else:
            # Something failed and nothing, not even its own exception, says what: a known warning of the same
            # log is the best lead (a warning never makes a clean log look failed: the class would be "none").
            warning = next((m for m in matches if m.level == "warning"), None)
            if failure_class == "other" and warning is not None:
                failure_class, source, confidence = warning.failure_class, "warning", warning.confidence
            else:
                if learned is not None and failure_class in FALLBACK_FOR:
                    decided = fallback_class(parsed, failure_class, learned)
                if decided is not None:
                    failure_class, class_source, confidence = (
                        decided.failure_class,
                        "model",
                        decided.confidence,
                    )
    low_confidence = decided.low_confidence if decided else False
    best_guesses = [(g.failure_class, g.probability) for g in decided.best_guesses] if decided else []
    if learned is not None:
        kind = decision_kind(class_source, source, failure_class, low_confidence)
        guesses = learned.predict(features(parsed)) if kind == "none" else []
        if kind == "none":  # the raw score of a kept `none`: the model's probability that nothing failed
            confidence = round(next(g.probability for g in guesses if g.failure_class == "none"), 3)
        confidence = learned.calibrated(kind, confidence)
        if (
            kind == "none"
            and confidence is not None
            and confidence < DOUBTFUL_NONE
            and parsed.outcome not in SERVING
        ):
            # "nothing failed" said of a log that never shows the server answering, which such verdicts
            # often get wrong: it stays `none` (no false alarm) but says so, with what else it may be
            low_confidence = True
            best_guesses = [(g.failure_class, round(g.probability, 3)) for g in guesses[:3]]
    print_ = fingerprint(parsed, failure_class, failures[0].id if failures else None)
    if failures and parsed.crash is None and parsed.outcome == "incomplete":
        _crash_from_signature(parsed, failures[0])
    return Diagnosis(
        parsed,
        matches,
        failure_class,
        source,
        print_,
        kb.digest,
        class_source=class_source,
        class_confidence=confidence,
        low_confidence=low_confidence,
        best_guesses=best_guesses,
    )


def _crash_from_signature(parsed: ParsedLog, match: Match) -> None:
    if match.failure_class in ("garbage_output", "timeout_hang") or not match.evidence:
        return
    first = match.evidence[0]
    parsed.crash = crash_from_fatal_line(first.line, first.rank, first.text, parsed.phases)
    parsed.outcome = "crashed"


def diagnose_sources(
    sources: Sequence[Source],
    *,
    progress: ProgressCallback | None = None,
    kb: KnowledgeBase | None = None,
    index: LineIndexWriter | None = None,
    model: Callable[[], Model | None] | None = None,
) -> Diagnosis:
    kb = kb or load_knowledge_base()
    parsed = parse_sources(sources, progress=progress, extra=ExtraPatterns(tuple(kb.patterns)), index=index)
    return diagnose(parsed, kb, model=model)


def analyze_sources(
    sources: Sequence[Source],
    *,
    progress: ProgressCallback | None = None,
    kb: KnowledgeBase | None = None,
    index: LineIndexWriter | None = None,
    model: Callable[[], Model | None] | None = None,
) -> dict[str, Any]:
    """The `match` document of docs/contract.md."""
    document = diagnose_sources(sources, progress=progress, kb=kb, index=index, model=model).to_dict()
    if document.get("failure_class") in (None, "none"):
        document["similar"] = {"cases": [], "groups": []}  # a clean log has nothing to compare
    else:
        from dispatchlab.core.similar import similar_document

        document["similar"] = similar_document(document)
    return document

"""What matching concludes about a parsed log: the known failures it matched, the class, the fingerprint.

Typed for the core; `to_dict` gives the `match` document of docs/contract.md at the boundaries.
"""

from __future__ import annotations

from typing import Any

from dispatchlab.core.parse.model import ParsedLog
from dispatchlab.core.records import field, record


@record
class Fix:
    summary: str
    args: dict[str, Any]
    env: dict[str, str]
    tried_and_failed: list[str]
    # flags of the fix the log's server does not take (or, server unknown, not every server takes): not offered
    withheld_args: dict[str, Any] = field(default_factory=dict)


@record
class Evidence:
    line: int
    rank: str | None
    text: str


@record
class Match:
    id: str
    title: str
    failure_class: str
    confidence: float
    lines: list[int]
    facts: dict[str, Any]
    fix: Fix
    severity: str
    level: str  # failure | warning
    explanation: str
    references: list[Any]
    evidence: list[Evidence]
    decisions: list[Any] = field(default_factory=list)
    source: str = "signature"  # "exception": no signature explains the crash, the terminal exception does

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "failure_class": self.failure_class,
            "confidence": self.confidence,
            "lines": self.lines,
            "facts": self.facts,
            "fix": vars(self.fix).copy(),
            "decisions": self.decisions,
            "severity": self.severity,
            "level": self.level,
            "explanation": self.explanation,
            "references": self.references,
            "evidence": [vars(e).copy() for e in self.evidence],
            "source": self.source,
        }


@record
class Diagnosis:
    parsed: ParsedLog
    matches: list[Match]
    failure_class: str
    failure_class_source: str  # signature | inferred | warning
    fingerprint: str
    kb_digest: str
    # what decided the class: "signature" | "exception" | "model" | "rules" (docs/contract.md, decision order)
    class_source: str = "rules"
    class_confidence: float | None = None
    low_confidence: bool = False
    best_guesses: list[tuple[str, float]] = field(default_factory=list)

    @property
    def top(self) -> Match | None:
        return self.matches[0] if self.matches else None

    def to_dict(self) -> dict[str, Any]:
        doc = self.parsed.to_dict()
        doc["matches"] = [m.to_dict() for m in self.matches]
        doc["failure_class"] = self.failure_class
        doc["failure_class_source"] = self.failure_class_source
        doc["fingerprint"] = self.fingerprint
        doc["kb_digest"] = self.kb_digest
        doc["class_source"] = self.class_source
        doc["class_confidence"] = self.class_confidence
        doc["low_confidence"] = self.low_confidence
        doc["best_guesses"] = [{"class": c, "probability": p} for c, p in self.best_guesses]
        return doc

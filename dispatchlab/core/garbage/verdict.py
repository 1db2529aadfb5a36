"""What the detector says about one answer: the kind of garbage, a reason for people, a score."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class GarbageKind(StrEnum):
    PUNCTUATION_RUN = "punctuation_run"
    REPEATED_TOKEN = "repeated_token"
    HASH_RUN = "hash_run"
    MIXED_SCRIPT_NOISE = "mixed_script_noise"
    TOKENIZER_LEAK = "tokenizer_leak"
    WORD_SALAD = "word_salad"
    EMPTY = "empty"


@dataclass(frozen=True)
class GarbageVerdict:
    garbage: bool
    kind: GarbageKind | None
    reason: str
    # Strength of the strongest evidence found, 0..1 (the dominating share, the loop's coverage, the
    # density of script noise); a clean answer carries its strongest sub-threshold evidence.
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "garbage": self.garbage,
            "kind": None if self.kind is None else str(self.kind),
            "reason": self.reason,
            "score": round(self.score, 3),
        }


def garbage_verdict(kind: GarbageKind, score: float, reason: str) -> GarbageVerdict:
    return GarbageVerdict(garbage=True, kind=kind, reason=reason, score=min(1.0, score))


def pct(share: float) -> str:
    return f"{round(share * 100)}%"


def show(unit: str) -> str:
    unit = " ".join(unit.split())
    return repr(unit if len(unit) <= 40 else unit[:37] + "...")


# What each check returns: a verdict when it found garbage, and the strength of its evidence either way.
Check = tuple[GarbageVerdict | None, float]

"""The detector: each check looks for one shape of broken decoding; the first that finds it decides."""

from __future__ import annotations

import unicodedata

from dispatchlab.core.garbage.characters import (
    BLANK_CHARS,
    broken_characters,
    collapse,
    empty_list,
    invisible_runs,
    lone_hashes,
    no_words,
    symbol_runs,
)
from dispatchlab.core.garbage.loops import phrase_loops, segment_loops
from dispatchlab.core.garbage.scripts import script_noise
from dispatchlab.core.garbage.tokens import bpe_markers, special_tokens
from dispatchlab.core.garbage.verdict import GarbageKind, GarbageVerdict, garbage_verdict
from dispatchlab.core.garbage.words import dominant_word, word_salad

# Answers are short; a huge one is judged on its head and tail, where loops and collapse show.
_MAX_CHARS = 20_000


def detect_garbage(text: str) -> GarbageVerdict:
    """Judge one answer: garbage (with the kind and a reason for people) or not."""
    if len(text) > _MAX_CHARS:
        text = text[: _MAX_CHARS // 2] + "\n" + text[-_MAX_CHARS // 2 :]
    if not text.strip():
        reason = "the answer is empty" if not text else "the answer is only whitespace"
        return garbage_verdict(GarbageKind.EMPTY, 1.0, reason)
    if all(ch.isspace() or ch in BLANK_CHARS or unicodedata.category(ch) == "Cf" for ch in text):
        reason = f"the answer is only invisible characters ({len(text)}, e.g. U+{ord(text.strip()[0]):04X})"
        return garbage_verdict(GarbageKind.EMPTY, 1.0, reason)
    visible = "".join(text.split())
    evidence = 0.0
    for check in (
        broken_characters,
        invisible_runs,
        special_tokens,
        bpe_markers,
        symbol_runs,
        lone_hashes,
        phrase_loops,
        segment_loops,
        empty_list,
        collapse,
        no_words,
        dominant_word,
        script_noise,
        word_salad,
    ):
        verdict, strength = check(text, visible)
        if verdict is not None:
            return verdict
        evidence = max(evidence, strength)
    return GarbageVerdict(garbage=False, kind=None, reason="looks like an ordinary answer", score=evidence)

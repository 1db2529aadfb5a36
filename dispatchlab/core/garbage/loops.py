"""Checks on repetition: a token, phrase or sentence the decoder repeats back to back."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from itertools import groupby

from dispatchlab.core.garbage.characters import DOMINANT, EMOJI_RUN, HASH_CHARS, NUCLEOTIDES, RULE_CHARS
from dispatchlab.core.garbage.scripts import script_of
from dispatchlab.core.garbage.verdict import Check, GarbageKind, garbage_verdict, pct, show

# The longest unit (in characters) a character loop is looked for with; longer ones are sentences.
_MAX_PERIOD = 40
# Loops of several stuck tokens that together cover this much of the answer are a hopping decoder.
_LOOPS_COVER = 0.6
# A loop the answer goes on from is garbage only when it is this much of the answer.
_LOOP_ALONE = 0.75
# A loop of a word or phrase that runs on to the end after a fluent start: this much of the answer.
_TO_THE_END = 0.2
# Shorter loops (four repeats or more) of this many different places in the answer, covering this much.
_BURSTS = 3
_BURSTS_COVER = 0.4


@dataclass(frozen=True)
class _Loop:
    unit: str
    repeats: int
    share: float  # visible characters inside the loop / visible characters of the answer
    start: int  # where the loop is in the answer with its whitespace collapsed
    end: int
    to_end: bool  # nothing but punctuation follows it: the decoder never got out


def _find_loops(text: str, visible_len: int) -> list[_Loop]:
    """Stretches where a unit of 1.._MAX_PERIOD characters repeats back to back, at least 4 times."""
    flat = " ".join(text.split())
    loops: list[_Loop] = []
    for period in range(1, min(_MAX_PERIOD, len(flat) // 4) + 1):
        start = 0
        for same, group in groupby(a == b for a, b in zip(flat, flat[period:], strict=False)):
            length = len(list(group))
            if same and length + period >= 4 * period and not _is_periodic(flat[start : start + period]):
                span = flat[start : start + length + period]
                unit = _word_aligned(span[:period])
                # 'the the the' holds three 'the ' although the last one lost its space.
                repeats = max((length + period) // period, span.count(unit.strip()))
                covered = len(span) - span.count(" ")
                end = start + length + period
                to_end = not any(ch.isalnum() for ch in flat[end:])
                loops.append(_Loop(unit, repeats, covered / visible_len, start, end, to_end))
            start += length
    return loops


def _is_periodic(unit: str) -> bool:
    """'xxxx' or 'abab': a shorter unit's loop already covers this stretch."""
    return len(unit) > 1 and unit in (unit + unit)[1:-1]


def _word_aligned(unit: str) -> str:
    """'he t' -> 'the ' style rotation so a reason quotes the repeated words, not a slice of them."""
    if " " in unit and not unit.startswith(" ") and not unit.endswith(" "):
        cut = unit.index(" ") + 1
        return unit[cut:] + unit[:cut]
    return unit


def _loop_is_garbage(loop: _Loop) -> bool:
    unit = "".join(loop.unit.split())
    if not unit:
        return False
    if set(unit) <= NUCLEOTIDES and not (len(unit) == 1 and loop.share >= 0.9):
        # a motif, or a poly-A tail inside a sentence; one letter and nothing else is a collapsed decoder
        return False
    if not loop.to_end and loop.share < _LOOP_ALONE:
        # 'very very very ... good question!', 'ho ho ho ..., Merry Christmas!': emphasis the answer
        # goes on from; a stuck decoder loops to max_tokens, or the loop is nearly all it says.
        return False
    letters = sum(1 for ch in unit if ch.isalpha())
    if letters * 2 >= len(unit):
        east_asian = any(script_of(ch) in ("CJK", "HANGUL") for ch in unit)
        if len(unit) <= 3 and " " not in loop.unit.strip() and not east_asian:
            # 'xxxxxxxx' in an API-key placeholder, 'AAAA' in base64: only when it is the whole answer.
            return loop.repeats >= 8 and loop.share >= DOMINANT
        if len(unit) == 1:
            return loop.repeats >= 8
        # '(_nl, _nl, _nl, ...)' or 'range(2), range(2), ...' in code is a part of the answer; a broken
        # model's loop takes it over, or runs on to max_tokens after a fluent start.
        return (
            (loop.repeats >= 8 and loop.share >= 0.35)
            or (loop.to_end and loop.repeats >= 8 and loop.share >= _TO_THE_END)
            or (loop.repeats >= 5 and loop.share >= DOMINANT)
            or (loop.repeats >= 4 and loop.share >= 0.75)
        )
    if any(ch.isdigit() for ch in unit):
        # 1000000000, 0x0000000000000000, a googol: numbers repeat digits legitimately.
        return loop.repeats >= 16 and loop.share >= 0.9
    if all(unicodedata.category(ch) == "So" for ch in unit):
        return loop.repeats >= EMOJI_RUN  # a row of emoji is a reply people send
    if set(unit) <= RULE_CHARS | HASH_CHARS:
        # '-----', '|---|---|', '=====': rules and table borders, garbage only as the whole answer.
        return loop.repeats >= 8 and loop.share >= 0.9
    return loop.repeats >= 8 and loop.share >= 0.6


def _word_unit(loop: _Loop) -> bool:
    """A loop of a word or phrase (letters, no digits): what a decoder stuck on tokens repeats."""
    unit = "".join(loop.unit.split())
    letters = sum(1 for ch in unit if ch.isalpha())
    return letters * 2 >= len(unit) > 0 and not any(ch.isdigit() for ch in unit)


def _syllable(loop: _Loop) -> bool:
    """'la', 'ha', 'na': a sung or laughed syllable, which people repeat in several bursts."""
    unit = "".join(loop.unit.split())
    return sum(ch.isalpha() for ch in unit) <= 2 and not any(
        script_of(ch) in ("CJK", "HANGUL") for ch in unit
    )


def _covered(text: str, loops: list[_Loop], visible_len: int) -> float:
    flat = " ".join(text.split())
    covered = [False] * len(flat)
    for loop in loops:
        covered[loop.start : loop.end] = [True] * (loop.end - loop.start)
    return sum(1 for index, ch in enumerate(flat) if covered[index] and ch != " ") / visible_len


def _hopping(text: str, loops: list[_Loop], visible_len: int) -> tuple[list[_Loop], float, bool]:
    """Loops of words and the share of the answer they cover together, and whether that is a decoder
    hopping from one stuck token to the next ('camin naman ... করিনি করিনি ... Encode Encode', 'gonna
    gonna gonna look look look'): it loops everywhere, though no one loop dominates. Two loops of eight
    or more must cover most of the answer; loops of four or more (sung syllables and motifs left out)
    must come in three places at least and cover a good part of it."""
    words = [loop for loop in loops if _word_unit(loop)]
    long = [loop for loop in words if loop.repeats >= 8]
    coverage = _covered(text, long, visible_len) if len(long) >= 2 else 0.0
    if coverage >= _LOOPS_COVER:
        return long, coverage, True
    bursts = [
        loop for loop in words if not _syllable(loop) and not set("".join(loop.unit.split())) <= NUCLEOTIDES
    ]
    if len(bursts) < _BURSTS:
        return long, coverage, False
    burst_coverage = _covered(text, bursts, visible_len)
    return bursts, burst_coverage, burst_coverage >= _BURSTS_COVER


def phrase_loops(text: str, visible: str) -> Check:
    loops = _find_loops(text, len(visible))
    flagged = [loop for loop in loops if _loop_is_garbage(loop)]
    strength = max((loop.share for loop in loops), default=0.0)
    hopping, coverage, garbage = _hopping(text, loops, len(visible))
    # Several loops that cover more than the worst one alone tell the story better.
    if not flagged or (garbage and coverage > max(loop.share for loop in flagged)):
        if garbage:
            units = list(dict.fromkeys(loop.unit.strip() for loop in hopping))
            shown = ", ".join(show(unit) for unit in units[:4]) + (", ..." if len(units) > 4 else "")
            reason = (
                f"{len(units)} tokens repeated back to back ({shown}) cover {pct(coverage)} of the answer"
            )
            return garbage_verdict(GarbageKind.REPEATED_TOKEN, max(coverage, 0.5), reason), coverage
        return None, max(strength, min(coverage, 0.49))
    loop = max(flagged, key=lambda item: (item.share, -len(item.unit)))
    unit = loop.unit.strip()
    words = len(unit.split())
    what = f"the phrase {show(unit)}" if words > 1 else show(unit)
    reason = f"{what} is repeated {loop.repeats} times in a row ({pct(loop.share)} of the answer)"
    if any(ch.isalnum() for ch in unit):
        return garbage_verdict(GarbageKind.REPEATED_TOKEN, max(loop.share, 0.5), reason), strength
    return garbage_verdict(GarbageKind.PUNCTUATION_RUN, max(loop.share, 0.5), reason), strength


# A sentence or a line: a decoder stuck on a passage longer than _MAX_PERIOD characters repeats these.
_SEGMENT_SPLIT = re.compile(r"\n|(?<=[.!?;。！？；])")
_SEGMENT_PERIOD = 8
# A cycle shorter than this is a word or a short phrase, which the character loops judge.
_SEGMENT_LETTERS = 20


def _segments(text: str) -> list[str]:
    return [part for part in (" ".join(piece.split()) for piece in _SEGMENT_SPLIT.split(text)) if part]


def segment_loops(text: str, visible: str) -> Check:
    """The same sentence or lines repeated to the end ('Wait, let me re-check ... Wait, let me re-check
    ...', a chat turn written again and again): a loop too long for the character check. It must reach
    the end (the last repeat may be cut by max_tokens) and repeat at least 4 times over a good part of
    the answer, or 3 times over nearly all of it; a quoted output printed three times stays ordinary."""
    segments = _segments(text)
    if len(segments) < 3:
        return None, 0.0
    strength = 0.0
    for period in range(1, min(_SEGMENT_PERIOD, len(segments) // 3) + 1):
        end = len(segments)
        last, model = segments[-1], segments[-1 - period]
        if last != model and model.startswith(last):
            end -= 1  # cut mid-sentence by max_tokens
        index = end - 1
        while index - period >= 0 and segments[index] == segments[index - period]:
            index -= 1
        first = index - period + 1
        repeats = (end - first) / period
        cycle = segments[end - period : end]
        if repeats < 3 or sum(ch.isalnum() for ch in "".join(cycle)) < _SEGMENT_LETTERS:
            continue
        covered = sum(len("".join(part.split())) for part in segments[first:]) / len(visible)
        strength = max(strength, min(covered, 0.49))
        if (repeats >= 4 and covered >= 0.4) or covered >= 0.8:
            what = "the sentence" if period == 1 else f"a passage of {period} sentences or lines"
            reason = (
                f"{what} {show(' '.join(cycle))} is repeated {int(repeats)} times to the end "
                f"({pct(covered)} of the answer)"
            )
            return garbage_verdict(GarbageKind.REPEATED_TOKEN, max(covered, 0.5), reason), covered
    return None, strength

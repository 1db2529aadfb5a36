"""Checks on writing systems: random subword pieces of many scripts glued together or strewn about."""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from dispatchlab.core.garbage.characters import count_broken
from dispatchlab.core.garbage.verdict import Check, GarbageKind, garbage_verdict

_SCRIPTS = frozenset(
    [
        "LATIN",
        "GREEK",
        "CYRILLIC",
        "ARMENIAN",
        "HEBREW",
        "ARABIC",
        "SYRIAC",
        "THAANA",
        "NKO",
        "SAMARITAN",
        "DEVANAGARI",
        "BENGALI",
        "GURMUKHI",
        "GUJARATI",
        "ORIYA",
        "TAMIL",
        "TELUGU",
        "KANNADA",
        "MALAYALAM",
        "SINHALA",
        "THAI",
        "LAO",
        "TIBETAN",
        "MYANMAR",
        "GEORGIAN",
        "HANGUL",
        "ETHIOPIC",
        "CHEROKEE",
        "CANADIAN",
        "OGHAM",
        "RUNIC",
        "TAGALOG",
        "KHMER",
        "MONGOLIAN",
        "LIMBU",
        "BUGINESE",
        "BALINESE",
        "SUNDANESE",
        "JAVANESE",
        "YI",
        "VAI",
        "TIFINAGH",
        "GLAGOLITIC",
        "CJK",
    ]
)
# Japanese mixes kanji, hiragana and katakana in one word: one group, as Chinese and Japanese share it.
_CJK_NAMES = frozenset({"CJK", "HIRAGANA", "KATAKANA", "KATAKANA-HIRAGANA", "IDEOGRAPHIC", "BOPOMOFO"})
# One CJK character (a Hangul syllable) carries about as much as a short word: weigh shares by it.
_SHARE_WEIGHT = {"CJK": 3, "HANGUL": 2}
# Scripts whose one- or two-letter pieces are ordinary (variables, Greek symbols in maths).
_FRAGMENT_EXEMPT = frozenset({"LATIN", "GREEK"})
_AT_HOME = 0.4
# Words on each side that make the neighbourhood a word is judged in.
_NEAR = 3
# A stray piece: this many letters at most (one CJK character, one Hangul syllable).
_STRAY_LETTERS = 2
# Noise events (glued pieces, stray pieces, undecodable characters) per script run.
_NOISE_DENSITY = 0.1


@lru_cache(maxsize=8192)
def script_of(ch: str) -> str | None:
    """The script of a letter ('LATIN', 'CYRILLIC', 'CJK', ...); '' for a mark that belongs to the
    letter before it; None for anything that is not a letter of a known script."""
    category = unicodedata.category(ch)
    if category[0] not in "LM":
        return None
    words = unicodedata.name(ch, "").split()
    if not words:
        return None
    first = words[1] if words[0] in ("FULLWIDTH", "HALFWIDTH") and len(words) > 1 else words[0]
    if first in _CJK_NAMES:
        return "CJK"
    if first == "COPTIC":
        return "GREEK"
    if first in _SCRIPTS:
        return first
    return "" if category[0] == "M" else None


@dataclass
class _Run:
    script: str
    letters: int
    glued: bool  # starts right after a letter of another script, with nothing between
    start: int
    end: int
    line: int


_OPENERS = "([{'\"«“‘「『《〈"
_CLOSERS = ")]}'\"»”’」』》〉"


def _script_runs(text: str) -> list[_Run]:
    runs: list[_Run] = []
    after_letter = False
    line = 0
    for index, ch in enumerate(text):
        if ch == "\n":
            line += 1
        script = script_of(ch)
        if script == "":
            if after_letter:
                runs[-1].end = index + 1
            continue
        if script is None:
            after_letter = False
            continue
        if after_letter and runs[-1].script == script:
            runs[-1].letters += 1
            runs[-1].end = index + 1
        else:
            runs.append(_Run(script, 1, glued=after_letter, start=index, end=index + 1, line=line))
        after_letter = True
    return runs


def _quoted(text: str, run: _Run) -> bool:
    """'(Ж)', "'و' means 'and'": a letter shown on purpose, not a stray piece."""
    return (
        run.start > 0
        and run.end < len(text)
        and text[run.start - 1] in _OPENERS
        and text[run.end] in _CLOSERS
    )


def _script_name(script: str) -> str:
    return script if script == "CJK" else script.title()


def _glue_is_ordinary(a: str, b: str, home: set[str]) -> bool:
    pair = {a, b}
    if pair in ({"LATIN", "GREEK"}, {"HANGUL", "CJK"}):
        return True
    # '用Python写', 'Pythonで', 'API를': Latin terms glued into CJK or Korean text where that is the language.
    return "LATIN" in pair and bool(pair & {"CJK", "HANGUL"} & home)


def _script_weights(runs: list[_Run]) -> Counter[str]:
    weight: Counter[str] = Counter()
    for run in runs:
        weight[run.script] += run.letters * _SHARE_WEIGHT.get(run.script, 1)
    return weight


def _home(weight: Counter[str]) -> set[str]:
    total = sum(weight.values())
    return {script for script, w in weight.items() if w / total >= _AT_HOME}


def script_noise(text: str, visible: str) -> Check:
    """Random token ids decoded by a multilingual BPE vocabulary: short pieces of many scripts, often
    glued together ('дом的ของ'), and stray letters of a script the answer is not written in."""
    runs = _script_runs(text)
    if len(runs) < 3:
        return None, 0.0
    weight = _script_weights(runs)
    # The languages the answer is written in: overall, on each line, and around each word, as one
    # answer may give English, then a Chinese sentence with Latin terms glued in, then a Korean one.
    home = _home(weight)
    line_home = {
        line: home | _home(_script_weights([run for run in runs if run.line == line]))
        for line in {run.line for run in runs}
    }
    glued = 0
    stray = 0
    for index, run in enumerate(runs):
        before = runs[index - 1].script if index else None
        after = runs[index + 1].script if index + 1 < len(runs) else None
        near = line_home[run.line] | _home(_script_weights(runs[max(0, index - _NEAR) : index + _NEAR + 1]))
        if run.glued and before is not None and not _glue_is_ordinary(before, run.script, near):
            glued += 1
        elif (
            not run.glued
            and run.script not in _FRAGMENT_EXEMPT
            and run.script not in near
            and run.letters <= (1 if run.script in _SHARE_WEIGHT else _STRAY_LETTERS)
            and before != run.script
            and after != run.script
            and not (after is not None and runs[index + 1].glued)
            and not _quoted(text, run)
        ):
            stray += 1
    broken = count_broken(text)
    events = glued + stray + broken
    density = events / len(runs)
    scripts = len(weight)
    # Two scripts glued is a language that mixes them (Tatar's Latin letters in Cyrillic words); single
    # letters alone ('the letter ж', 'the character 水') need to be many before they are noise.
    strays_only = not glued and not broken
    if (
        events >= 3
        and density >= _NOISE_DENSITY
        and scripts >= 3
        and not (strays_only and (stray < 4 or density < 0.15))
    ):
        names = ", ".join(_script_name(script) for script, _ in weight.most_common(6))
        names += ", ..." if scripts > 6 else ""
        parts = [f"{glued} words glued across scripts"] if glued else []
        if stray:
            parts.append(f"{stray} stray pieces of scripts the answer is not written in")
        if broken:
            parts.append(f"{broken} undecodable characters")
        reason = f"random pieces of {scripts} scripts ({names}) among {len(runs)} words: {', '.join(parts)}"
        return garbage_verdict(GarbageKind.MIXED_SCRIPT_NOISE, max(density, 0.5), reason), density
    return None, min(density, 0.49) if events else 0.0

"""Is a model's answer nonsense? The GPU worker asks this of every re-run launch that starts serving.

Broken kernels and random weights rarely fail loudly: the server starts and answers, but decoding
collapses to token 0 (`!!!!!!!!`), loops on one token or phrase (or hops from one stuck token to the
next), scatters '#' pieces, counts list markers with nothing after them, or emits random subword pieces
from many scripts glued together. A loop counts when the decoder never gets out of it (it runs to the
end) or it is nearly the whole answer; emphasis, refrains, nucleotide motifs and rows of emoji do not. Each detector looks for one of those shapes and is tuned to stay silent on
ordinary answers in any language, code, lists and numbers; tests/core/test_garbage.py measures both on
a corpus. Word salad written in one script (random English subwords) is out of reach without a
dictionary, and is not claimed.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from itertools import groupby
from typing import Any


class GarbageKind(StrEnum):
    PUNCTUATION_RUN = "punctuation_run"
    REPEATED_TOKEN = "repeated_token"
    HASH_RUN = "hash_run"
    MIXED_SCRIPT_NOISE = "mixed_script_noise"
    TOKENIZER_LEAK = "tokenizer_leak"
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


# Answers are short; a huge one is judged on its head and tail, where loops and collapse show.
_MAX_CHARS = 20_000
# Characters that legitimately come in long runs (rules, underlines, leaders, brackets, arrows):
# they count as garbage only when they are practically the whole answer.
_RULE_CHARS = frozenset("-=_~*.`|+/\\<>()[]{}:─━═—")
_HASH_CHARS = frozenset("#＃")
# Token 0 of the GPT-2, Llama 3 and Qwen vocabularies is '!': a run this long is collapse, not emphasis.
_LOUD_CHARS = frozenset("!?！？¡¿")
_LOUD_RUN = 16
_EMOJI_RUN = 32
_SYMBOL_TOKEN = re.compile(r"[^\w\s]")
# '# Setup', '## Title', '###  Misc': a comment or header line makes '#' runs around it code or markup.
_COMMENT_LINE = re.compile(r"^[ \t]*#+[^#\n]*[^\W\d_]", re.MULTILINE)
_DOMINANT = 0.5
_MAX_PERIOD = 40
_LOOPS_COVER = 0.6
_LONE_HASHES = 8
_LOOP_ALONE = 0.75
# 'ATGATGATG', '(CAG)n': a nucleotide sequence repeats its motif by nature
_NUCLEOTIDES = frozenset("ACGTUN")

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


def _verdict(kind: GarbageKind, score: float, reason: str) -> GarbageVerdict:
    return GarbageVerdict(garbage=True, kind=kind, reason=reason, score=min(1.0, score))


def _pct(share: float) -> str:
    return f"{round(share * 100)}%"


def _show(unit: str) -> str:
    unit = " ".join(unit.split())
    return repr(unit if len(unit) <= 40 else unit[:37] + "...")


def detect_garbage(text: str) -> GarbageVerdict:
    """Judge one answer: garbage (with the kind and a reason for people) or not."""
    if len(text) > _MAX_CHARS:
        text = text[: _MAX_CHARS // 2] + "\n" + text[-_MAX_CHARS // 2 :]
    if not text.strip():
        reason = "the answer is empty" if not text else "the answer is only whitespace"
        return _verdict(GarbageKind.EMPTY, 1.0, reason)
    if all(ch.isspace() or ch in _BLANK_CHARS or unicodedata.category(ch) == "Cf" for ch in text):
        reason = f"the answer is only invisible characters ({len(text)}, e.g. U+{ord(text.strip()[0]):04X})"
        return _verdict(GarbageKind.EMPTY, 1.0, reason)
    visible = "".join(text.split())
    evidence = 0.0
    for check in (
        _broken_characters,
        _special_tokens,
        _bpe_markers,
        _symbol_runs,
        _lone_hashes,
        _loops,
        _segment_loops,
        _empty_list,
        _dominant_word,
        _script_noise,
    ):
        verdict, strength = check(text, visible)
        if verdict is not None:
            return verdict
        evidence = max(evidence, strength)
    return GarbageVerdict(garbage=False, kind=None, reason="looks like an ordinary answer", score=evidence)


_Check = tuple[GarbageVerdict | None, float]


def _is_broken(ch: str) -> bool:
    """U+FFFD (undecodable bytes), control characters other than whitespace, unassigned code points."""
    if ch == "\ufffd":
        return True
    category = unicodedata.category(ch)
    return category in ("Cs", "Cn") or (category == "Cc" and not ch.isspace())


def _count_broken(text: str) -> int:
    # ESC starting an ANSI colour sequence ('\x1b[1m') is formatting, not a broken byte.
    return sum(1 for index, ch in enumerate(text) if _is_broken(ch) and text[index : index + 2] != "\x1b[")


def _broken_characters(text: str, visible: str) -> _Check:
    broken = _count_broken(text)
    share = broken / len(visible)
    # One U+FFFD at the end is a multi-byte character cut by max_tokens, not a broken model.
    if broken and ((broken >= 3 and share >= 0.05) or share >= 0.3):
        reason = (
            f"{broken} replacement or control characters (undecodable bytes), {_pct(share)} of the answer"
        )
        return _verdict(GarbageKind.MIXED_SCRIPT_NOISE, max(share, 0.5), reason), share
    return None, share


def _longest_run(visible: str, ch: str) -> int:
    return max((len(list(group)) for key, group in groupby(visible) if key == ch), default=0)


# Characters that draw nothing though they are not whitespace: Hangul fillers, the blank Braille cell.
_BLANK_CHARS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
# Control tokens of the common vocabularies, printed because the server decoded them as text:
# '<|im_end|>', '<|eot_id|>', '<｜begin▁of▁sentence｜>', '</s>', '<unk>', '[PAD]', '<0x0A>', '<extra_id_3>'.
_SPECIAL_TOKEN = re.compile(
    r"<[|｜][^<>\s|｜]{1,60}[|｜]>"
    r"|</?s>|<(?:unk|pad|mask|eos|bos|sep|cls|eod|eot)>"
    r"|<(?:start|end)_of_turn>|<extra_id_\d+>|<0x[0-9A-Fa-f]{2}>"
    r"|\[(?:PAD|UNK|MASK|CLS|SEP)\]"
)
# Tokens that stand for nothing (unknown, padding, raw bytes, unused slots): a few of them in an answer
# mean the ids were not the ones the tokenizer knows.
_FILLER_TOKEN = re.compile(
    r"<unk>|\[UNK\]|<pad>|\[PAD\]|<0x[0-9A-Fa-f]{2}>|<extra_id_\d+>|<[|｜]reserved_special_token_\d+[|｜]>"
)
_FILLER_TOKENS = 3
_TOKEN_RUN = 3
# A chat template shown as an example is half tokens; an answer of tokens only is a broken decoder.
_TOKENS_ALONE = 0.75
# Code spans and fenced blocks: an answer about tokenizers quotes '<|im_end|>' there on purpose.
_CODE_SPAN = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`", re.DOTALL)


def _special_tokens(text: str, visible: str) -> _Check:
    """Control tokens in the answer's text: mostly tokens, an end token repeated back to back (the
    server never stopped on it), or several that stand for no text at all ('<unk>', '<0xE4>')."""
    prose = _CODE_SPAN.sub(" ", text)
    found = list(_SPECIAL_TOKEN.finditer(prose))
    if not found:
        return None, 0.0
    share = sum(len(match.group()) for match in found) / len(visible)
    run: list[re.Match[str]] = []
    for match in [*found, None]:
        if match is not None and run:
            last = run[-1]
            if match.group() == last.group() and not prose[last.end() : match.start()].strip():
                run.append(match)
                continue
        if len(run) >= _TOKEN_RUN:
            reason = f"the control token {_show(run[0].group())} is repeated {len(run)} times in a row"
            return _verdict(GarbageKind.REPEATED_TOKEN, max(share, 0.5), reason), share
        run = [] if match is None else [match]
    if len(found) >= 2 and share >= _TOKENS_ALONE:
        reason = f"{len(found)} control tokens ({_show(found[0].group())}, ...) make up {_pct(share)} of the answer"
        return _verdict(GarbageKind.TOKENIZER_LEAK, share, reason), share
    fillers = _FILLER_TOKEN.findall(prose)
    if len(fillers) >= _FILLER_TOKENS:
        shown = ", ".join(_show(token) for token in dict.fromkeys(fillers))
        reason = f"{len(fillers)} tokens that stand for no text ({shown}) in the answer"
        return _verdict(GarbageKind.TOKENIZER_LEAK, max(share, 0.5), reason), share
    return None, min(share, 0.49)


# Byte-level BPE markers shown instead of what they encode: GPT-2's 'Ġ' (a space) and 'Ċ' (a newline),
# SentencePiece's '▁', and 'âĢ' that starts GPT-2's spelling of '’', '“', '—'. A word starts with one
# in Maltese ('Ġgħ'); glued inside a run of words they are a decoder that skipped the byte mapping.
_BPE_MARK = re.compile(r"(?<=[^\s'\"`‘’“”(\[])[Ġ▁Ċ](?=\S)|âĢ")
_BPE_MARKS = 4
_BPE_SHARE = 0.2


def _bpe_markers(text: str, visible: str) -> _Check:
    marks = len(_BPE_MARK.findall(_CODE_SPAN.sub(" ", text)))
    if not marks:
        return None, 0.0
    words = max(1, len(re.findall(r"[^\W\d_]+", text)))
    share = marks / words
    if marks >= _BPE_MARKS and share >= _BPE_SHARE:
        reason = f"{marks} tokenizer markers ('Ġ', '▁', 'Ċ', 'âĢ') glued into words, {share:.1f} per word"
        return _verdict(GarbageKind.TOKENIZER_LEAK, max(share, 0.5), reason), share
    return None, min(share, 0.49)


def _symbol_runs(text: str, visible: str) -> _Check:
    symbols = Counter(ch for ch in visible if unicodedata.category(ch)[0] in "PS")
    if not symbols:
        return None, 0.0
    ch, count = symbols.most_common(1)[0]
    share = count / len(visible)
    run = _longest_run(visible, ch)
    if run < 8:
        return None, 0.0
    if ch in _HASH_CHARS:
        # Comment banners ('##### Helpers #####', a '#' line above and below a title) are code; a
        # collapsed answer is all '#' or ends in a long run after some text.
        stripped = text.strip()
        tail = len(stripped) - len(stripped.rstrip("".join(_HASH_CHARS)))
        collapsed = share >= 0.6 and tail >= _LOUD_RUN and stripped[0] not in _HASH_CHARS
        if (share >= 0.9 or collapsed) and not _COMMENT_LINE.search(text):
            reason = f"{_pct(share)} of the answer is the character {ch!r} repeated (a run of {run})"
            return _verdict(GarbageKind.HASH_RUN, share, reason), share
        return None, share
    needed = 0.9 if ch in _RULE_CHARS else _DOMINANT
    # '👍👍👍👍👍👍👍👍👍👍', '🎉🎉🎉': people answer with a row of emoji; a collapsed decoder runs far longer
    if share >= needed and (unicodedata.category(ch) != "So" or run >= _EMOJI_RUN):
        reason = f"{_pct(share)} of the answer is the character {ch!r} repeated (a run of {run})"
        return _verdict(GarbageKind.PUNCTUATION_RUN, share, reason), share
    if ch in _LOUD_CHARS and run >= _LOUD_RUN:
        reason = f"the answer collapses into a run of {run} {ch!r} ({_pct(share)} of the answer)"
        return _verdict(GarbageKind.PUNCTUATION_RUN, max(share, 0.5), reason), share
    return None, share


def _lone_hashes(text: str, visible: str) -> _Check:
    """'# # # // Seng# # #0xA': '#' pieces scattered between spaces across the answer. A comment or a
    header opens its line with one '#' and words follow; a broken decoder drops them mid-line too."""
    lines = [line.split() for line in text.splitlines()]
    tokens = sum(len(words) for words in lines)
    if not tokens:
        return None, 0.0
    lone = [
        (row, index)
        for row, words in enumerate(lines)
        for index, word in enumerate(words)
        if set(word) <= _HASH_CHARS
    ]
    share = len(lone) / tokens
    mid_line = sum(1 for _, index in lone if index > 0)
    # a banner ('# # # # # # #') is one line or two; scattered pieces come on many
    rows = len({row for row, index in lone if index > 0})
    if mid_line >= _LONE_HASHES and rows >= 3 and share >= _DOMINANT:
        reason = f"{len(lone)} of the answer's {tokens} words are a lone '#' ({mid_line} of them mid-line)"
        return _verdict(GarbageKind.HASH_RUN, share, reason), share
    return None, share if mid_line else 0.0


_LIST_MARKER = re.compile(r"(?<!\S)\d{1,4}[.)](?!\S)")
_EMPTY_LIST_MARKERS = 10


def _empty_list(text: str, visible: str) -> _Check:
    """'1.  2.  3.  4. ...': a numbered list whose items are all empty. Decoding stuck on the list's
    markers counts on to max_tokens; a list a person asked for has something after each number."""
    markers = _LIST_MARKER.findall(text)
    if len(markers) < _EMPTY_LIST_MARKERS:
        return None, 0.0
    rest = len(visible) - sum(len(marker) for marker in markers)
    if rest <= 0.1 * len(visible):
        reason = f"a numbered list of {len(markers)} items, all empty ({markers[0]} to {markers[-1]})"
        return _verdict(GarbageKind.REPEATED_TOKEN, max(1 - rest / len(visible), 0.5), reason), 0.0
    return None, 0.0


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
    if set(unit) <= _NUCLEOTIDES and not (len(unit) == 1 and loop.share >= 0.9):
        # a motif, or a poly-A tail inside a sentence; one letter and nothing else is a collapsed decoder
        return False
    if not loop.to_end and loop.share < _LOOP_ALONE:
        # 'very very very ... good question!', 'ho ho ho ..., Merry Christmas!': emphasis the answer
        # goes on from; a stuck decoder loops to max_tokens, or the loop is nearly all it says.
        return False
    letters = sum(1 for ch in unit if ch.isalpha())
    if letters * 2 >= len(unit):
        east_asian = any(_script(ch) in ("CJK", "HANGUL") for ch in unit)
        if len(unit) <= 3 and " " not in loop.unit.strip() and not east_asian:
            # 'xxxxxxxx' in an API-key placeholder, 'AAAA' in base64: only when it is the whole answer.
            return loop.repeats >= 8 and loop.share >= _DOMINANT
        if len(unit) == 1:
            return loop.repeats >= 8
        # '(_nl, _nl, _nl, ...)' or 'range(2), range(2), ...' in code is a part of the answer; a broken
        # model's loop takes it over.
        return (
            (loop.repeats >= 8 and loop.share >= 0.35)
            or (loop.repeats >= 5 and loop.share >= _DOMINANT)
            or (loop.repeats >= 4 and loop.share >= 0.75)
        )
    if any(ch.isdigit() for ch in unit):
        # 1000000000, 0x0000000000000000, a googol: numbers repeat digits legitimately.
        return loop.repeats >= 16 and loop.share >= 0.9
    if all(unicodedata.category(ch) == "So" for ch in unit):
        return loop.repeats >= _EMOJI_RUN  # a row of emoji is a reply people send
    if set(unit) <= _RULE_CHARS | _HASH_CHARS:
        # '-----', '|---|---|', '=====': rules and table borders, garbage only as the whole answer.
        return loop.repeats >= 8 and loop.share >= 0.9
    return loop.repeats >= 8 and loop.share >= 0.6


def _word_unit(loop: _Loop) -> bool:
    """A loop of a word or phrase (letters, no digits): what a decoder stuck on tokens repeats."""
    unit = "".join(loop.unit.split())
    letters = sum(1 for ch in unit if ch.isalpha())
    return letters * 2 >= len(unit) > 0 and not any(ch.isdigit() for ch in unit)


def _loop_coverage(text: str, loops: list[_Loop], visible_len: int) -> tuple[list[_Loop], float]:
    """Loops of eight or more words and the share of the answer they cover together: a decoder that
    hops from one stuck token to the next ('camin naman ... করিনি করিনি ... Encode Encode') loops
    everywhere, though no one loop dominates."""
    long = [loop for loop in loops if loop.repeats >= 8 and _word_unit(loop)]
    if len(long) < 2:
        return long, 0.0
    flat = " ".join(text.split())
    covered = [False] * len(flat)
    for loop in long:
        covered[loop.start : loop.end] = [True] * (loop.end - loop.start)
    visible = sum(1 for index, ch in enumerate(flat) if covered[index] and ch != " ")
    return long, visible / visible_len


def _loops(text: str, visible: str) -> _Check:
    loops = _find_loops(text, len(visible))
    flagged = [loop for loop in loops if _loop_is_garbage(loop)]
    strength = max((loop.share for loop in loops), default=0.0)
    if not flagged:
        long, coverage = _loop_coverage(text, loops, len(visible))
        if coverage >= _LOOPS_COVER:
            units = list(dict.fromkeys(loop.unit.strip() for loop in long))
            shown = ", ".join(_show(unit) for unit in units[:4]) + (", ..." if len(units) > 4 else "")
            reason = (
                f"{len(units)} tokens repeated back to back ({shown}) cover {_pct(coverage)} of the answer"
            )
            return _verdict(GarbageKind.REPEATED_TOKEN, coverage, reason), max(strength, coverage)
        return None, max(strength, coverage)
    loop = max(flagged, key=lambda item: (item.share, -len(item.unit)))
    unit = loop.unit.strip()
    words = len(unit.split())
    what = f"the phrase {_show(unit)}" if words > 1 else _show(unit)
    reason = f"{what} is repeated {loop.repeats} times in a row ({_pct(loop.share)} of the answer)"
    if any(ch.isalnum() for ch in unit):
        return _verdict(GarbageKind.REPEATED_TOKEN, max(loop.share, 0.5), reason), strength
    return _verdict(GarbageKind.PUNCTUATION_RUN, max(loop.share, 0.5), reason), strength


# A sentence or a line: a decoder stuck on a passage longer than _MAX_PERIOD characters repeats these.
_SEGMENT_SPLIT = re.compile(r"\n|(?<=[.!?;。！？；])")
_SEGMENT_PERIOD = 8
# A cycle shorter than this is a word or a short phrase, which the character loops judge.
_SEGMENT_LETTERS = 20


def _segments(text: str) -> list[str]:
    return [part for part in (" ".join(piece.split()) for piece in _SEGMENT_SPLIT.split(text)) if part]


def _segment_loops(text: str, visible: str) -> _Check:
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
                f"{what} {_show(' '.join(cycle))} is repeated {int(repeats)} times to the end "
                f"({_pct(covered)} of the answer)"
            )
            return _verdict(GarbageKind.REPEATED_TOKEN, max(covered, 0.5), reason), covered
    return None, strength


def _words(text: str) -> list[str]:
    """Words with letters; each CJK character counts as a word of its own."""
    words: list[str] = []
    for chunk in text.split():
        word = ""
        for ch in chunk:
            if _script(ch) == "CJK":
                if word:
                    words.append(word)
                    word = ""
                words.append(ch)
            elif ch.isalnum() or ch in "<>|_":
                # Case kept: a broken model repeats one token exactly, and 'Buffalo buffalo ...' is English.
                word += ch
            elif word:
                words.append(word)
                word = ""
        if word:
            words.append(word)
    # One-letter words are variables and '%s' placeholders; a CJK character is a word on its own.
    return [
        word
        for word in words
        if any(ch.isalpha() for ch in word) and (len(word) > 1 or _script(word) == "CJK")
    ]


def _dominant_word(text: str, visible: str) -> _Check:
    """One token dominating the answer without being back to back ('the of the the and the the')."""
    words = _words(text)
    if len(words) < 10:
        return None, 0.0
    word, count = Counter(words).most_common(1)[0]
    where = [index for index, each in enumerate(words) if each == word]
    if where[-1] - where[0] + 1 == count:
        return None, 0.0  # one back-to-back run: the loop check judged it
    # Code repeats names ('Tuple[int, int]', 'raise E -> raise E(V)') between its symbols: count those
    # symbols as tokens too, so only prose made of one word dominates.
    tokens = len(words) + len(_SYMBOL_TOKEN.findall(text))
    share = count / tokens
    # 'import os\nimport sys\n...' is half 'import': dominating means more than that.
    if count >= 8 and share >= 0.6 and not _refrain(text, word):
        reason = f"{_show(word)} makes up {_pct(share)} of the words ({count} of {tokens})"
        return _verdict(GarbageKind.REPEATED_TOKEN, share, reason), share
    return None, share


_PHRASE_END = re.compile(r"[,.;:!?…，。！？、]")


def _refrain(text: str, word: str) -> bool:
    """'La la la, la la la, la la la la.': a sung syllable comes in phrases the punctuation marks off,
    of varying length; a decoder's dominant token is strewn through the text without that rhythm."""
    phrases = [phrase.split() for phrase in _PHRASE_END.split(text.lower())]
    sung = [len(words) for words in phrases if words and set(words) == {word.lower()}]
    return len(sung) >= 3 and len(set(sung)) > 1


@lru_cache(maxsize=8192)
def _script(ch: str) -> str | None:
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
        script = _script(ch)
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


def _script_noise(text: str, visible: str) -> _Check:
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
    broken = _count_broken(text)
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
        return _verdict(GarbageKind.MIXED_SCRIPT_NOISE, max(density, 0.5), reason), density
    return None, min(density, 0.49) if events else 0.0

"""Checks on characters: undecodable bytes, runs of one symbol, scattered '#' pieces, empty list markers."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from itertools import groupby

from dispatchlab.core.garbage.verdict import Check, GarbageKind, garbage_verdict, pct

# Characters that legitimately come in long runs (rules, underlines, leaders, brackets, arrows):
# they count as garbage only when they are practically the whole answer.
RULE_CHARS = frozenset("-=_~*.`|+/\\<>()[]{}:─━═—")
HASH_CHARS = frozenset("#＃")
# Token 0 of the GPT-2, Llama 3 and Qwen vocabularies is '!': a run this long is collapse, not emphasis.
_LOUD_CHARS = frozenset("!?！？¡¿")
LOUD_RUN = 16
EMOJI_RUN = 32
SYMBOL_TOKEN = re.compile(r"[^\w\s]")
# '# Setup', '## Title', '###  Misc': a comment or header line makes '#' runs around it code or markup.
_COMMENT_LINE = re.compile(r"^[ \t]*#+[^#\n]*[^\W\d_]", re.MULTILINE)
# The share of an answer one symbol or word must hold to dominate it.
DOMINANT = 0.5
_LONE_HASHES = 8
# U+FFFD inside the text (not the last character) this many times.
_FFFD_INSIDE = 2
_INVISIBLE_RUN = 8
_COLLAPSE = 8
_NO_WORDS = 8
# 'ATGATGATG', '(CAG)n': a nucleotide sequence repeats its motif by nature
NUCLEOTIDES = frozenset("ACGTUN")


def _is_broken(ch: str) -> bool:
    """U+FFFD (undecodable bytes), control characters other than whitespace, unassigned code points."""
    if ch == "\ufffd":
        return True
    category = unicodedata.category(ch)
    return category in ("Cs", "Cn") or (category == "Cc" and not ch.isspace())


def count_broken(text: str) -> int:
    # ESC starting an ANSI colour sequence ('\x1b[1m') is formatting, not a broken byte.
    return sum(1 for index, ch in enumerate(text) if _is_broken(ch) and text[index : index + 2] != "\x1b[")


def broken_characters(text: str, visible: str) -> Check:
    broken = count_broken(text)
    share = broken / len(visible)
    # One U+FFFD at the end is a multi-byte character cut by max_tokens, not a broken model; inside the
    # text, between words it goes on with, U+FFFD is a detokenizer that split a character's bytes.
    inside = visible.rstrip("\ufffd").count("\ufffd")
    if broken and ((broken >= 3 and share >= 0.05) or share >= 0.3 or inside >= _FFFD_INSIDE):
        reason = f"{broken} replacement or control characters (undecodable bytes), {pct(share)} of the answer"
        return garbage_verdict(GarbageKind.MIXED_SCRIPT_NOISE, max(share, 0.5), reason), share
    return None, share


def _invisible(ch: str) -> bool:
    """Drawn as nothing, though not the space, tab or newline an answer is laid out with."""
    if ch in " \t\n\r":
        return False
    return ch.isspace() or ch in BLANK_CHARS or unicodedata.category(ch) == "Cf"


def invisible_runs(text: str, visible: str) -> Check:
    """'Once upon a time,' and then U+200A after U+200A: a decoder stuck on a token that draws nothing.
    A soft hyphen or a zero-width joiner between words comes alone; a stuck one comes in a run."""
    run = max((len(list(group)) for key, group in groupby(text) if _invisible(key)), default=0)
    if run >= _INVISIBLE_RUN:
        ch = next(key for key, group in groupby(text) if _invisible(key) and len(list(group)) == run)
        reason = f"the answer runs into {run} invisible characters U+{ord(ch):04X} in a row"
        return garbage_verdict(GarbageKind.REPEATED_TOKEN, 0.5 + min(run / 100, 0.5), reason), 1.0
    return None, 0.0


def collapse(text: str, visible: str) -> Check:
    """'GGG GGGGG', 'lllllllll1111111111': the whole answer is one or two characters, each repeated.
    Numbers ('1000000', '0000') and rows of emoji are what some questions ask for."""
    runs = [(key, len(list(group))) for key, group in groupby(visible)]
    if (
        len(visible) >= _COLLAPSE
        and len(runs) <= 2
        and all(length >= 3 for _, length in runs)
        and not visible.isdigit()
        and not any(unicodedata.category(key) == "So" for key, _ in runs)
    ):
        shown = " then ".join(f"{key!r} {length} times" for key, length in runs)
        reason = f"the answer is only {shown}"
        return garbage_verdict(GarbageKind.REPEATED_TOKEN, 1.0, reason), 1.0
    return None, 0.0


def no_words(text: str, visible: str) -> Check:
    """')." !+,'-$..-.': punctuation and nothing else, no letter, digit or emoji. A smiley (':-)') or a
    drawn box ('+--+') is short or made of few characters; noise is longer and varied."""
    if len(visible) < _NO_WORDS or len(set(visible)) < 4:
        return None, 0.0
    if any(unicodedata.category(ch)[0] in "LN" or unicodedata.category(ch) == "So" for ch in visible):
        return None, 0.0
    reason = f"the answer has no letter, digit or emoji: {len(visible)} punctuation characters"
    return garbage_verdict(GarbageKind.PUNCTUATION_RUN, 1.0, reason), 1.0


def _longest_run(visible: str, ch: str) -> int:
    return max((len(list(group)) for key, group in groupby(visible) if key == ch), default=0)


# Characters that draw nothing though they are not whitespace: Hangul fillers, the blank Braille cell.
BLANK_CHARS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def symbol_runs(text: str, visible: str) -> Check:
    symbols = Counter(ch for ch in visible if unicodedata.category(ch)[0] in "PS")
    if not symbols:
        return None, 0.0
    ch, count = symbols.most_common(1)[0]
    share = count / len(visible)
    run = _longest_run(visible, ch)
    if run < 8:
        return None, 0.0
    if ch in HASH_CHARS:
        # Comment banners ('##### Helpers #####', a '#' line above and below a title) are code; a
        # collapsed answer is all '#' or ends in a long run after some text.
        stripped = text.strip()
        tail = len(stripped) - len(stripped.rstrip("".join(HASH_CHARS)))
        collapsed = share >= 0.6 and tail >= LOUD_RUN and stripped[0] not in HASH_CHARS
        if (share >= 0.9 or collapsed) and not _COMMENT_LINE.search(text):
            reason = f"{pct(share)} of the answer is the character {ch!r} repeated (a run of {run})"
            return garbage_verdict(GarbageKind.HASH_RUN, share, reason), share
        return None, share
    needed = 0.9 if ch in RULE_CHARS else DOMINANT
    # '👍👍👍👍👍👍👍👍👍👍', '🎉🎉🎉': people answer with a row of emoji; a collapsed decoder runs far longer
    if share >= needed and (unicodedata.category(ch) != "So" or run >= EMOJI_RUN):
        reason = f"{pct(share)} of the answer is the character {ch!r} repeated (a run of {run})"
        return garbage_verdict(GarbageKind.PUNCTUATION_RUN, share, reason), share
    if ch in _LOUD_CHARS and run >= LOUD_RUN:
        reason = f"the answer collapses into a run of {run} {ch!r} ({pct(share)} of the answer)"
        return garbage_verdict(GarbageKind.PUNCTUATION_RUN, max(share, 0.5), reason), share
    return None, share


def lone_hashes(text: str, visible: str) -> Check:
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
        if set(word) <= HASH_CHARS
    ]
    share = len(lone) / tokens
    mid_line = sum(1 for _, index in lone if index > 0)
    # a banner ('# # # # # # #') is one line or two; scattered pieces come on many
    rows = len({row for row, index in lone if index > 0})
    if mid_line >= _LONE_HASHES and rows >= 3 and share >= DOMINANT:
        reason = f"{len(lone)} of the answer's {tokens} words are a lone '#' ({mid_line} of them mid-line)"
        return garbage_verdict(GarbageKind.HASH_RUN, share, reason), share
    return None, share if mid_line else 0.0


_LIST_MARKER = re.compile(r"(?<!\S)\d{1,4}[.)](?!\S)")
_EMPTY_LIST_MARKERS = 10


def empty_list(text: str, visible: str) -> Check:
    """'1.  2.  3.  4. ...': a numbered list whose items are all empty. Decoding stuck on the list's
    markers counts on to max_tokens; a list a person asked for has something after each number."""
    markers = _LIST_MARKER.findall(text)
    if len(markers) < _EMPTY_LIST_MARKERS:
        return None, 0.0
    rest = len(visible) - sum(len(marker) for marker in markers)
    if rest <= 0.1 * len(visible):
        reason = f"a numbered list of {len(markers)} items, all empty ({markers[0]} to {markers[-1]})"
        return garbage_verdict(GarbageKind.REPEATED_TOKEN, max(1 - rest / len(visible), 0.5), reason), 0.0
    return None, 0.0

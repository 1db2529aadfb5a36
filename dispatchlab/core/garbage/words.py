"""Checks on words: one token dominating the answer without being back to back."""

from __future__ import annotations

import re
from collections import Counter

from dispatchlab.core.garbage.characters import SYMBOL_TOKEN
from dispatchlab.core.garbage.scripts import script_of
from dispatchlab.core.garbage.verdict import Check, GarbageKind, garbage_verdict, pct, show


def _words(text: str) -> list[str]:
    """Words with letters; each CJK character counts as a word of its own."""
    words: list[str] = []
    for chunk in text.split():
        word = ""
        for ch in chunk:
            if script_of(ch) == "CJK":
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
        if any(ch.isalpha() for ch in word) and (len(word) > 1 or script_of(word) == "CJK")
    ]


def dominant_word(text: str, visible: str) -> Check:
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
    tokens = len(words) + len(SYMBOL_TOKEN.findall(text))
    share = count / tokens
    # 'import os\nimport sys\n...' is half 'import': dominating means more than that.
    if count >= 8 and share >= 0.6 and not _refrain(text, word):
        reason = f"{show(word)} makes up {pct(share)} of the words ({count} of {tokens})"
        return garbage_verdict(GarbageKind.REPEATED_TOKEN, share, reason), share
    return None, share


_PHRASE_END = re.compile(r"[,.;:!?…，。！？、]")


def _refrain(text: str, word: str) -> bool:
    """'La la la, la la la, la la la la.': a sung syllable comes in phrases the punctuation marks off,
    of varying length; a decoder's dominant token is strewn through the text without that rhythm."""
    phrases = [phrase.split() for phrase in _PHRASE_END.split(text.lower())]
    sung = [len(words) for words in phrases if words and set(words) == {word.lower()}]
    return len(sung) >= 3 and len(set(sung)) > 1

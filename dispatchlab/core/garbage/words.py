"""Checks on words: one token dominating the answer without being back to back, and word salad
(prose lines made of words with hardly any of the short grammatical words every language needs)."""

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


# The commonest grammatical words of Latin-script languages: running prose in any of them has one word in
# four or five of these; subword pieces drawn at random have hardly any.
_FUNCTION_WORDS_BY_LANGUAGE = {
    "en": "the of and to a in is it that for on was with as be by at this are from or an not but have has "
    "had were which you i we he she they his her their its our your my me him them there what when who will "
    "would can could should may do does did so if no all any one also than then these those about into "
    "more some such only other been being how where why up out over after just very here",
    "de": "der die das und ist zu den von mit sich des auf für nicht ein eine als auch es an er dem im sie wie wir ich wird sind bei oder aus nach",
    "fr": "le la les et est un une des du en que qui dans pour pas sur au ne il elle se ce sont avec par plus",
    "es": "el los las y es que en un una por con para del al se lo como pero su sus más",
    "pt": "o os as e um uma não do da dos das com para em no na mais",
    "it": "il di che non per si con una sono della nel",
    "nl": "de het een en van is op dat niet te zijn ik je",
    "sv no da": "och att det som en på är av för med inte og er til",
    "pl": "i w na z się nie do to że jest",
    "tr": "ve bir bu da de için ile çok ne en gibi olarak daha",
    "vi": "và của là có các những được trong cho không một người",
    "id ms": "yang dan di ini itu dengan untuk dari tidak ke ada",
    "fi": "ja on ei se että oli kun mutta ovat tai hän joka myös kuin niin",
    "cs hu": "a v s je že az és hogy van meg egy nem is",
    "sw tl": "na ya wa za kwa ni katika ang ng sa mga ay at",
}
_FUNCTION_WORDS = frozenset(word for words in _FUNCTION_WORDS_BY_LANGUAGE.values() for word in words.split())
_WORD = re.compile(r"[^\W\d_]+")
# a link's path and query are not words of the sentence around it ("docs python org library urllib request")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
# A line of prose: this many words at least, few symbols (code, tables and markup have many), not a
# comma-separated list, not a title.
_PROSE_WORDS = 12
_PROSE_SYMBOLS = 0.1
_LIST_COMMAS = 0.3
_TITLE_CASE = 0.6
_PROSE_PUNCTUATION = frozenset(".,;:!?'\"()-’“”")
_SALAD_WORDS = 30
_SALAD_SHARE = 0.12


def _prose_words(text: str) -> list[str]:
    words: list[str] = []
    for line in text.splitlines():
        line = _URL.sub(" ", line) if "://" in line else line
        line_words = [word for word in _WORD.findall(line) if script_of(word[0]) == "LATIN"]
        if len(line_words) < _PROSE_WORDS:
            continue
        visible = "".join(line.split())
        symbols = sum(1 for ch in visible if not ch.isalnum() and ch not in _PROSE_PUNCTUATION)
        commas = line.count(",") + line.count(";")
        # Title Case: a headline or a row of names, which need no grammatical words.
        capitalised = sum(1 for word in line_words if word[0].isupper())
        if (
            symbols <= _PROSE_SYMBOLS * len(visible)
            and commas <= _LIST_COMMAS * len(line_words)
            and capitalised <= _TITLE_CASE * len(line_words)
        ):
            words += line_words
    return words


def word_salad(text: str, visible: str) -> Check:
    """' Paris chlorine low k tout assemblylisted readymade being was b, breath), it was remot...':
    words in one script, each plausible, none holding the others together."""
    words = _prose_words(text)
    if len(words) < _SALAD_WORDS:
        return None, 0.0
    grammatical = sum(1 for word in words if word.lower() in _FUNCTION_WORDS)
    share = grammatical / len(words)
    if share < _SALAD_SHARE:
        reason = (
            f"{len(words)} words of prose with only {grammatical} grammatical words among them "
            f"('the', 'of', 'and' ...: {pct(share)}); ordinary prose has one in four or five"
        )
        return garbage_verdict(GarbageKind.WORD_SALAD, 1 - share, reason), 1 - share
    return None, min(0.49, max(0.0, 1 - share / 0.4) * 0.49)

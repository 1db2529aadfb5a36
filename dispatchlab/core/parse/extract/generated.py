"""Generated text: the answers a log shows, judged for garbage, and the proof that the server answered.

Answers show up as pasted response JSON (`"content": "..."` in a chat completion, `{"text": ...}` from
SGLang's /generate, `"text_output"` of Triton's generate endpoint, `"generated_text"` of TGI-style servers,
openai-python reprs), as server log lines that print outputs (SGLang `--log-requests`
`Finish: obj=..., out={'text': ...}`, vLLM `--enable-log-outputs` `Generated response ...: output: '...'`,
`Generated text: '...'` of vLLM's offline examples), as a labelled pasted output (`Output: "..."`, TRT-LLM
run.py's `Output [Text 0 Beam 0]: "..."`, a chat transcript's `assistant: ...`), as a bare pasted line that
is one token repeated, and as any line where one word repeats back to back (a rollout sample printed by a
trainer, an answer pasted into prose).
Prompts look the same (`"content"` in a request's messages), so a value counts as an answer only when
the nearest marker around it is a response's (`"choices"`, `"role": "assistant"`, `out=`, ...).
"""

from __future__ import annotations

import operator
import re
from typing import ClassVar

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import ErrorLine
from dispatchlab.core.parse.observations import FatalLine, Observations
from dispatchlab.core.parse.vocabulary import MAX_ERRORS, MAX_MESSAGE, without_numbers

# a JSON or Python-repr string value, possibly cut by the end of the pasted line
_STRING = r"(?:\"(?P<dq>[^\"\\]*(?:\\.[^\"\\]*)*)\"?|'(?P<sq>[^'\\]*(?:\\.[^'\\]*)*)'?)"
_JSON_VALUE = lazy_compile(r"[\"'](?:text|content|reasoning_content)[\"']\s*:\s*" + _STRING)
# keys only a response has: their value is an answer wherever the document is
_OUTPUT_VALUE = lazy_compile(r"[\"'](?:text_output|generated_text|output_text)[\"']\s*:\s*" + _STRING)
# a pasted output under a label of its own at the start of a line; a chat transcript's assistant turn
_LABEL_VALUE = lazy_compile(
    r"^\s*(?:Output|Response|Answer|Completion|Prediction|Generated(?: text| output)?|Model output)"
    r"(?: \[Text \d+ Beam \d+\])?\s*:\s*" + _STRING
)
_TRANSCRIPT_VALUE = lazy_compile(r"^\s*(?:assistant|Assistant|ASSISTANT)\s*:\s*(?P<free>\S.*)")
_KEYWORD_VALUE = lazy_compile(
    r"\b(?:ChatCompletionMessage\(content|CompletionChoice\([^()]*?\btext)=" + _STRING
)
_LOG_VALUE = lazy_compile(
    r"(?:Generated response \S+(?: \(streaming complete\))?: output: |Generated text: |"
    r"CompletionOutput\(index=\d+, text=|\bout=\{[\"']text[\"']: )" + _STRING
)
_RESPONSE_MARK = lazy_compile(
    r"[\"'](?:choices|meta_info|finish_reason|delta)[\"']\s*:|[\"']role[\"']\s*:\s*[\"']assistant|"
    r"[\"']object[\"']\s*:\s*[\"'](?:chat\.completion|text_completion)|\bout=\{|ChatCompletion\(|Completion\("
)
_REQUEST_MARK = lazy_compile(
    r"\bcurl\s|-d\s+'|--data\b|[\"'](?:messages|prompt|sampling_params|input)[\"']\s*:|"
    r"[\"']role[\"']\s*:\s*[\"'](?:user|system)|\bobj=\w+\(|requests\.post\(|Received request|prompt: "
)
# up to 32 characters: a chat template's special token (`<｜begin▁of▁sentence｜>`) is 22
_REPEAT = lazy_compile(r"(\S{2,32}?)\1{10,}")
_LONG_RUN = lazy_compile(r"\S{22,}")
# control characters no printed text holds (tab, newline and the like aside)
_CONTROL = lazy_compile(r"[\x00-\x08\x0e-\x1f\x7f]")
# one word with letters, eight times back to back: the loop a collapsed decoder falls into
_WORD_LOOP = lazy_compile(r"(?<!\S)([^\W\d_][^\s\d]{1,23})(?: \1){7,}(?!\S)")
# what an array printout repeats (`[nan nan nan ...]`, `True True ...`) is a value, not an answer's word
_ARRAY_VALUES = frozenset({"nan", "inf", "-inf", "none", "null", "true", "false"})
# vocabulary slots no training text contains (Llama 3's reserved specials, Gemma's unused, Qwen's extra):
# an answer that samples one is decoding random token ids
_UNTRAINED_TOKEN = lazy_compile(r"<\|reserved(?:_special_token_\d+)?\|>|<unused\d+>|<\|extra_\d+\|>")
_ESCAPE = lazy_compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|(.))", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
# a pretty-printed JSON's `"content": "..."` line belongs to the last document marker within this reach
_CONTEXT_LINES = 60
_SHOWN = 80
# judging one answer takes milliseconds and a `--log-requests` log prints one per request: judge the first
# ones, then a sample (a broken kernel garbles every answer, so the sample still finds it)
_JUDGED_ALL = 20
# a looping line loops from its start: its first characters are judged (a megabyte prompt took 40 ms a line)
_LOOP_JUDGED_CHARS = 64 * 1024
_JUDGED_EVERY = 1000
_JUDGED_CHARS = 4000  # a long answer is judged on its head and tail, where collapse and loops show


def decode_escapes(text: str) -> str:
    """JSON and Python-repr escapes decoded tolerantly: an unknown one keeps its character, surrogate pairs join."""

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return chr(int(m.group(1), 16))
        if m.group(2):
            return chr(int(m.group(2), 16))
        ch = m.group(3)
        return _SIMPLE_ESCAPES.get(ch, ch)

    decoded = _ESCAPE.sub(one, text)
    return decoded.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _may_repeat(run: str) -> bool:
    """Whether a unit `_bare_repeat` counts may repeat in `run`: each of its characters (two different ones at
    least, a letter among them) is there eleven times. Counting them is cheap; the repeat search tried every
    unit length at every offset (each start of a crash loop's launch command)."""
    frequent = [ch for ch in set(run) if run.count(ch) >= 11]
    return len(frequent) > 1 and any(ch.isalpha() for ch in frequent)


def _may_loop(msg: str) -> bool:
    """Whether `_WORD_LOOP` may match: its word's copies between the first and the last are six or more words
    in a row, space-separated, the same, the word before them ends with it and the one after them starts with
    it. Comparing the words costs a fifth of the search (3 ms on a long prompt); they are split a piece of the
    text at a time, the last seven carried on (a 64 KB prompt's 10,000 words at once raised the peak by 3 MB)."""
    words: list[str] = []
    start = 0
    while start <= len(msg):
        end = msg.find(" ", start + _PIECE_CHARS)
        end = len(msg) if end < 0 else end
        # the words before: a window whose first word is past them needs them; one that starts among
        # them was tried with the piece before
        words = words[-7:] + msg[start:end].split(" ")
        same = bytes(map(operator.eq, words, words[1:]))
        at = same.find(_SIX_SAME)
        while at >= 0:
            word = words[at]
            if 0 < at < len(words) - 6 and words[at - 1].endswith(word) and words[at + 6].startswith(word):
                return True
            at = same.find(_SIX_SAME, at + 1)
        start = end + 1
    return False


_PIECE_CHARS = 8192
_SIX_SAME = b"\x01" * 5  # five neighbours equal: six words


def _value(m: re.Match[str]) -> str:
    raw = m.group("dq") if m.group("dq") is not None else m.group("sq") or ""
    return decode_escapes(raw)


def _nearest(pattern: re.Pattern[str], text: str, position: int) -> tuple[int, int]:
    """(last start before `position` or -1, first start after it or len+1) of the pattern in text."""
    before, after = -1, len(text) + 1
    for m in pattern.finditer(text):
        if m.start() < position:
            before = m.start()
        elif after > len(text):
            after = m.start()
    return before, after


def garbage_reason(answer: str) -> str | None:
    """Why an answer is garbage, or None: the detector's verdict, or an untrained token sampled."""
    if len(answer) > _JUDGED_CHARS:
        answer = answer[: _JUDGED_CHARS // 2] + "\n" + answer[-_JUDGED_CHARS // 2 :]
    from dispatchlab.core.garbage import detect_garbage  # only for logs that show generated text

    verdict = detect_garbage(answer)
    if verdict.garbage:
        return verdict.reason
    untrained = _UNTRAINED_TOKEN.search(answer)
    if untrained:
        return f"the answer contains {untrained.group(0)}, a reserved token no training text holds (random token ids)"
    return None


class Generated:
    RULES: ClassVar[dict[str, str]] = {
        "gen_json": (
            r"[\"'](?:text|content|reasoning_content|text_output|generated_text|output_text)[\"']\s*:\s*[\"']"
        ),
        "gen_label": (
            r"^\s*(?:(?:Output|Response|Answer|Completion|Prediction|Generated(?: text| output)?|Model output)"
            r"(?: \[Text \d+ Beam \d+\])?\s*:\s*[\"']|(?:assistant|Assistant|ASSISTANT)\s*:\s*\S)"
        ),
        "gen_keyword": r"ChatCompletionMessage\(content=|CompletionChoice\(",
        "gen_log": (
            r"Generated response \S+(?: \(streaming complete\))?: output: |Generated text: |"
            r"CompletionOutput\(index=\d+, text=|\bout=\{[\"']text[\"']: "
        ),
        # one token repeated 11 times makes a word of 22 characters or more: a cheap gate for Hyperscan and
        # Python alike; the backreference (`_REPEAT`) runs in handle, on bare lines only. As a rule it would
        # be slow twice: Hyperscan's prefilter widens it to any line, and Python's search tries every unit
        # length at every character of every long word (1 ms on a 2 KB path).
        # Only a line that starts with its text can be bare output (`_bare_repeat`): anchored by `(?:^)`, which
        # Hyperscan keeps (a bare `^` it drops), so a traceback's indented frame paths are not candidates.
        # A raw line may start with blanks that a `Line N: ` label or a table gutter puts before the text.
        "gen_repeat": r"(?:^)(?:\S|[ \t]*Line \d+: |[ \t]+[|+])[^\n]*?\S{22}",
        # twelve words in a row, each starting with a letter: the gate for `_WORD_LOOP` (a backreference,
        # checked in handle on these lines only)
        "gen_words": r"(?:[^\W\d_][^\s\d]{1,23} ){12}",
        "gen_doc_mark": (
            r"[\"']choices[\"']\s*:|[\"']role[\"']\s*:\s*[\"'](?:assistant|user|system)|"
            r"[\"']object[\"']\s*:\s*[\"'](?:chat\.completion|text_completion)|\bcurl\s|"
            r"[\"'](?:messages|prompt|sampling_params)[\"']\s*:"
        ),
    }
    # twelve words scanned with bounded word lengths take Hyperscan a third of its scan; unbounded, they are
    # half as slow and still a superset (a first byte of 0x80 or more: a word that starts with a non-ASCII letter)
    GATES: ClassVar[dict[str, str]] = {"gen_words": r"(?:[A-Za-z\x80-\xff][^\s\d]* ){12}"}
    # No literal to look for: Hyperscan runs them over every byte, two thirds of a server log's scan. A big log
    # is read with them in stretches (chunkscan.SAMPLED_STRETCH_BYTES): a garbled answer printed in response
    # JSON or an output line is found by the other rules everywhere, and a broken kernel garbles every answer
    SAMPLED: ClassVar[dict[str, str]] = {
        "gen_repeat": "a bare output line of one token repeated",
        "gen_words": "a word repeated back to back",
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs
        # the last document marker of a pretty-printed JSON seen: (line, True for a response)
        self.context: tuple[int, bool] | None = None
        self.answers = 0  # lines with answers seen

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        answers = self._answers(line, hits)
        if "gen_doc_mark" in hits and "gen_log" not in hits:
            self._note_context(line)  # where a pretty-printed document's later lines belong
        if not answers:
            return self._looping_line(line, hits)
        if self.obs.served_line is None:
            self.obs.served_line = line.number
        self.answers += 1
        if self.answers <= _JUDGED_ALL or self.answers % _JUDGED_EVERY == 0:
            for answer in answers:
                reason = garbage_reason(answer)
                if reason:
                    self._garbage(line, answer, reason)
                    break
        return True  # an answer's words ("CUDA error", "Traceback") are not the server's own

    def _answers(self, line: Line, hits: Hits) -> list[str]:
        msg = line.msg
        if "gen_log" in hits:
            return [_value(m) for m in _LOG_VALUE.finditer(msg)]
        answers = [_value(m) for m in _KEYWORD_VALUE.finditer(msg)] if "gen_keyword" in hits else []
        if "gen_label" in hits:
            labelled = _LABEL_VALUE.match(msg)
            if labelled:
                answers.append(_value(labelled))
            elif transcript := _TRANSCRIPT_VALUE.match(msg):
                answers.append(transcript.group("free"))
        if "gen_json" in hits:
            answers += [_value(m) for m in _OUTPUT_VALUE.finditer(msg)]
            answers += [
                _value(m) for m in _JSON_VALUE.finditer(msg) if self._is_answer(msg, m.start(), line.number)
            ]
        if not answers and "gen_repeat" in hits and self._bare_repeat(line):
            answers.append(msg.strip())
        return answers

    def _is_answer(self, msg: str, position: int, number: int) -> bool:
        """A `"text"`/`"content"` value is an answer when the nearest marker around it is a response's."""
        response_before, response_after = _nearest(_RESPONSE_MARK, msg, position)
        request_before, request_after = _nearest(_REQUEST_MARK, msg, position)
        if response_before >= 0 or request_before >= 0:
            return response_before > request_before
        if response_after <= len(msg) or request_after <= len(msg):
            return response_after < request_after
        if msg.lstrip().startswith("{"):
            # a one-line document of its own: SGLang's /generate answers `{"text": ...` (cut before meta_info)
            return msg.lstrip()[1:].lstrip().startswith(('"text"', "'text'"))
        context = self.context
        return context is not None and context[1] and number - context[0] <= _CONTEXT_LINES

    def _note_context(self, line: Line) -> None:
        msg = line.msg
        response = max((m.start() for m in _RESPONSE_MARK.finditer(msg)), default=-1)
        request = max((m.start() for m in _REQUEST_MARK.finditer(msg)), default=-1)
        if response >= 0 or request >= 0:
            self.context = (line.number, response > request)

    @staticmethod
    def _bare_repeat(line: Line) -> bool:
        """A pasted output line (no log prefix) where a token with letters repeats back to back."""
        if line.prefixed or line.level is not None or line.msg.startswith((" ", "\t")):
            return False
        if _CONTROL.search(line.msg):
            return False  # binary bytes (a core dump in the log), not text: the repeat search crawls on them
        msg = line.msg
        return any(
            len(set(unit)) > 1 and any(ch.isalpha() for ch in unit)
            for run in _LONG_RUN.finditer(
                msg
            )  # eleven copies of a unit of two or more: 22 characters at least
            if _may_repeat(run.group(0))
            for unit in (m.group(1) for m in _REPEAT.finditer(msg, run.start(), run.end()))
        )

    def _looping_line(self, line: Line, hits: Hits) -> bool:
        """A line with no answer marker where a word with letters repeats eight times back to back (a rollout
        sample a trainer prints, an answer pasted into prose) is judged whole; it counts only when garbage,
        as the line may be anything else."""
        if "gen_words" not in hits or self.answers >= _JUDGED_ALL:
            return False
        msg = line.msg[:_LOOP_JUDGED_CHARS]
        if not _may_loop(msg) or not any(
            m.group(1).lower() not in _ARRAY_VALUES for m in _WORD_LOOP.finditer(msg)
        ):
            return False
        reason = garbage_reason(msg.strip())
        if reason is None:
            return False
        self.answers += 1
        if self.obs.served_line is None:
            self.obs.served_line = line.number
        self._garbage(line, msg.strip(), reason)
        return True

    def _garbage(self, line: Line, answer: str, reason: str) -> None:
        obs = self.obs
        shown = " ".join(answer.split())
        shown = shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."
        text = f"Garbage output: {reason}: {shown!r}"
        key = without_numbers(text, 300)
        entry = obs.errors.get(key)
        if entry is not None:
            entry.count += 1
            if line.rank and line.rank not in entry.ranks:
                entry.ranks.append(line.rank)
            return
        if len(obs.errors) < MAX_ERRORS:
            ranks = [line.rank] if line.rank else []
            obs.errors[key] = ErrorLine(
                line.number, line.rank, ranks, "garbage_output", text[:MAX_MESSAGE], 1, line.time, False
            )
        else:
            obs.errors_omitted += 1
        obs.fatal_lines.append(FatalLine(line.number, line.rank, "garbage_output", text))
        obs.event(line, "error", "garbage_output", text[:300])

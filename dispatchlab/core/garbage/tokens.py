"""Checks on the tokenizer's own pieces printed as text: control tokens and byte-level BPE markers."""

from __future__ import annotations

import re

from dispatchlab.core.garbage.verdict import Check, GarbageKind, garbage_verdict, pct, show

# Control tokens of the common vocabularies, printed because the server decoded them as text:
# '<|im_end|>', '<|eot_id|>', '<｜begin▁of▁sentence｜>', '</s>', '<unk>', '[PAD]', '<0x0A>', '<extra_id_3>'.
_SPECIAL_TOKEN = re.compile(
    r"<[|｜][^<>\s|｜]{1,60}[|｜]>"
    r"|</?s>|<(?:unk|pad|mask|eos|bos|sep|cls|eod|eot)>"
    r"|<(?:start|end)_of_turn>|<extra_id_\d+>|<0x[0-9A-Fa-f]{2}>"
    r"|\[(?:PAD|UNK|MASK|CLS|SEP)\]|<unused\d+>|\[unused\d+\]"
)
# Tokens that stand for nothing (unknown, padding, raw bytes, unused slots): a few of them in an answer
# mean the ids were not the ones the tokenizer knows.
_FILLER_TOKEN = re.compile(
    r"<unk>|\[UNK\]|<pad>|\[PAD\]|<0x[0-9A-Fa-f]{2}>|<extra_id_\d+>|<[|｜]reserved_special_token_\d+[|｜]>"
)
_FILLER_TOKENS = 3
# Slots of the vocabulary no text was ever trained into ('<|reserved_special_token_247|>', Gemma's
# '<unused12>', BERT's '[unused3]'): a model samples one only when its logits are broken.
_UNUSED_TOKEN = re.compile(r"<[|｜][^<>|｜\s]*reserved[^<>|｜\s]*[|｜]>|<unused\d+>|\[unused\d+\]")
_TOKEN_RUN = 3
# A chat template shown as an example is half tokens; an answer of tokens only (even one end token
# and nothing else) is a broken decoder.
_TOKENS_ALONE = 0.75
# Code spans and fenced blocks: an answer about tokenizers quotes '<|im_end|>' there on purpose.
CODE_SPAN = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`", re.DOTALL)


def special_tokens(text: str, visible: str) -> Check:
    """Control tokens in the answer's text: mostly tokens, an end token repeated back to back (the
    server never stopped on it), or several that stand for no text at all ('<unk>', '<0xE4>')."""
    prose = CODE_SPAN.sub(" ", text)
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
            reason = f"the control token {show(run[0].group())} is repeated {len(run)} times in a row"
            return garbage_verdict(GarbageKind.REPEATED_TOKEN, max(share, 0.5), reason), share
        run = [] if match is None else [match]
    unused = _UNUSED_TOKEN.findall(prose)
    if unused:
        reason = f"the answer holds {len(unused)} unused vocabulary slots ({show(unused[0])}), which no text maps to"
        return garbage_verdict(GarbageKind.TOKENIZER_LEAK, max(share, 0.5), reason), share
    if share >= _TOKENS_ALONE:
        reason = (
            f"{len(found)} control tokens ({show(found[0].group())}, ...) make up {pct(share)} of the answer"
        )
        return garbage_verdict(GarbageKind.TOKENIZER_LEAK, share, reason), share
    fillers = _FILLER_TOKEN.findall(prose)
    if len(fillers) >= _FILLER_TOKENS:
        shown = ", ".join(show(token) for token in dict.fromkeys(fillers))
        reason = f"{len(fillers)} tokens that stand for no text ({shown}) in the answer"
        return garbage_verdict(GarbageKind.TOKENIZER_LEAK, max(share, 0.5), reason), share
    return None, min(share, 0.49)


# Byte-level BPE markers shown instead of what they encode: GPT-2's 'Ġ' (a space) and 'Ċ' (a newline),
# SentencePiece's '▁', and 'âĢ' that starts GPT-2's spelling of '’', '“', '—'. A word starts with one
# in Maltese ('Ġgħ'); glued inside a run of words they are a decoder that skipped the byte mapping.
_BPE_MARK = re.compile(r"(?<=[^\s'\"`‘’“”(\[])[Ġ▁Ċ](?=\S)|âĢ")
_BPE_MARKS = 4
_BPE_SHARE = 0.2


def bpe_markers(text: str, visible: str) -> Check:
    marks = len(_BPE_MARK.findall(CODE_SPAN.sub(" ", text)))
    if not marks:
        return None, 0.0
    words = max(1, len(re.findall(r"[^\W\d_]+", text)))
    share = marks / words
    if marks >= _BPE_MARKS and share >= _BPE_SHARE:
        reason = f"{marks} tokenizer markers ('Ġ', '▁', 'Ċ', 'âĢ') glued into words, {share:.1f} per word"
        return garbage_verdict(GarbageKind.TOKENIZER_LEAK, max(share, 0.5), reason), share
    return None, min(share, 0.49)

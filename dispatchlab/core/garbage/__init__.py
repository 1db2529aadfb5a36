"""Is a model's answer nonsense? The GPU worker asks this of every re-run launch that starts serving.

Broken kernels and random weights rarely fail loudly: the server starts and answers, but decoding
collapses to token 0 (`!!!!!!!!`) or to one character, loops on one token or phrase (or hops from one
stuck token to the next), runs on an invisible character, scatters '#' pieces, counts list markers with
nothing after them, prints control tokens or unused vocabulary slots, splits characters into U+FFFD, or
emits random subword pieces: from many scripts glued together, or from one script as prose without the
grammatical words every language needs (word salad). A loop counts when the decoder never gets out of it
(it runs to the end) or it is nearly the whole answer; emphasis, refrains, nucleotide motifs and rows of
emoji do not. Each check looks for one of those shapes and is tuned to stay silent on ordinary answers
in any language, code, lists and numbers; tests/core/test_garbage.py measures both on a corpus and
bench/garbage_detector.py on real answers. Out of reach: one stray token in fluent text, a switch of
language mid-sentence, and nonsense of a few words.

Modules by what they look at: `characters` (bytes and symbols), `tokens` (the tokenizer's own pieces),
`loops` (repetition), `words` (word statistics), `scripts` (writing systems); `detect` runs them.
"""

from dispatchlab.core.garbage.detect import detect_garbage
from dispatchlab.core.garbage.verdict import GarbageKind, GarbageVerdict

__all__ = ["GarbageKind", "GarbageVerdict", "detect_garbage"]

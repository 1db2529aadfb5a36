"""Is a model's answer nonsense? The GPU worker asks this of every re-run launch that starts serving.

Broken kernels and random weights rarely fail loudly: the server starts and answers, but decoding
collapses to token 0 (`!!!!!!!!`), loops on one token or phrase (or hops from one stuck token to the
next), scatters '#' pieces, counts list markers with nothing after them, or emits random subword pieces
from many scripts glued together. A loop counts when the decoder never gets out of it (it runs to the
end) or it is nearly the whole answer; emphasis, refrains, nucleotide motifs and rows of emoji do not.
Each check looks for one of those shapes and is tuned to stay silent on ordinary answers in any
language, code, lists and numbers; tests/core/test_garbage.py measures both on a corpus. Word salad
written in one script (random English subwords) is out of reach without a dictionary, and is not claimed.

Modules by what they look at: `characters` (bytes and symbols), `tokens` (the tokenizer's own pieces),
`loops` (repetition), `words` (word statistics), `scripts` (writing systems); `detect` runs them.
"""

from dispatchlab.core.garbage.detect import detect_garbage
from dispatchlab.core.garbage.verdict import GarbageKind, GarbageVerdict

__all__ = ["GarbageKind", "GarbageVerdict", "detect_garbage"]

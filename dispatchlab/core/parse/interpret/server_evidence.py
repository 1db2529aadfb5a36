"""Which server wrote the log, and how we know: its own line format and dumps first, else every line that
names it, weighed.

The log's format (SGLang's `[time TP0]` prefix, vLLM's `INFO mm-dd` one, an args dump, a startup banner)
decides when it speaks. Otherwise each server's mentions (extract/servers.py), its frames in tracebacks and
the versions the log reports are summed; the heavier side wins, by a margin, and the document says it was
inferred and quotes the line that says so most directly. A tie, or nothing, leaves the server unknown.
"""

from __future__ import annotations

from typing import Any

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract.servers import STRONG
from dispatchlab.core.parse.interpret.server import decide_engine
from dispatchlab.core.parse.observations import Observations

SERVERS = ("sglang", "vllm")
# at most this much from frames: a deep stack is one traceback, not many witnesses
_FRAME_WEIGHT_CAP = 3
# SGLang imports some of vLLM's layers, so vLLM frames appear in SGLang logs; vLLM never runs SGLang code
_SGLANG_FRAME_BONUS = 2
_IN_PACKAGE = {server: lazy_compile(rf"(?:^|[/\\]){server}[/\\]") for server in SERVERS}


def _weights(obs: Observations) -> dict[str, int]:
    weights = {
        server: sum(w for w, _line, _text in obs.server_mentions.get(server, [])) for server in SERVERS
    }
    for server in SERVERS:
        frames = sum(1 for tb in obs.tracebacks for f in tb.frames if _IN_PACKAGE[server].search(f.file))
        if frames:
            weights[server] += min(frames, _FRAME_WEIGHT_CAP) + (
                _SGLANG_FRAME_BONUS if server == "sglang" else 0
            )
        if obs.versions.get(server):
            weights[server] += 1  # an environment report lists both when both are installed
    return weights


def _quote(obs: Observations, server: str) -> tuple[int | None, str | None]:
    mentions = sorted(obs.server_mentions.get(server, []), key=lambda m: (-m[0], m[1]))
    if mentions:
        return mentions[0][1], mentions[0][2]
    frame = next(
        ((tb.line, f.file) for tb in obs.tracebacks for f in tb.frames if _IN_PACKAGE[server].search(f.file)),
        None,
    )
    if frame is not None:
        return frame[0], f'File "{frame[1]}"'
    return None, None


def decide_server(obs: Observations) -> tuple[str | None, dict[str, Any] | None]:
    """The engine (as `decide_engine` names it) and where it was read: `{"source": "log"}` when the log's own
    format or dumps said it, `{"source": "inferred", "line", "text", "weights"}` when lines naming it did."""
    if any(obs.server_votes.values()):
        engine = decide_engine(obs)
        if engine in SERVERS:
            line, text = _quote(obs, engine)
            return engine, {"source": "log", "line": line, "text": text}
        return engine, None
    weights = _weights(obs)
    best = max(SERVERS, key=lambda s: weights[s])
    other = min(SERVERS, key=lambda s: weights[s])
    if weights[best] == 0 or weights[best] == weights[other]:
        engine = decide_engine(obs)
        return (engine, None) if engine not in SERVERS else (None, None)
    # one strong line outweighs a handful of paths of the other server, never a strong line of it
    if weights[other] >= STRONG and weights[best] < 2 * weights[other]:
        return None, None
    line, text = _quote(obs, best)
    return best, {"source": "inferred", "line": line, "text": text, "weights": weights}

"""Lines that name the server: what tells SGLang from vLLM when the log's own line format does not.

An excerpt pasted from a wrapper (a cloud logger, a supervisor, a CI job) loses the server's prefixes, yet its
lines still say `vllm version 0.24.0`, "Killing local vLLM worker processes", `(EngineCore_DP0 pid=...)`,
`sglang.srt...`. Each such line is a mention with a weight: a line only one server prints (its banner, its
process names, its modules) weighs 3, a path or variable in its namespace 1. The interpret stage weighs them
(`interpret/server_evidence.py`).
"""

from __future__ import annotations

import re
from typing import ClassVar

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.observations import Observations

STRONG, WEAK = 3, 1
# a server's mentions kept per weight (the first lines are the ones the page quotes)
_KEEP = 8

# (server, weight, pattern): what each server, and only it, prints or is called
MARKERS: tuple[tuple[str, int, re.Pattern[str]], ...] = (
    (
        "vllm",
        STRONG,
        lazy_compile(
            r"\bvLLM API server version\b|\bvllm(?: version|==| v)\s?\d|\bvLLM Version\s*:|"
            r"Killing local vLLM worker processes|\bvllm serve\b|\bvllm\.(?:entrypoints|engine|v1|model_executor|"
            r"worker|config|distributed|executor|collect_env)\b|\bV1 LLM engine\b|\bVllmConfig\b|"
            r"\((?:EngineCore(?:_DP\d+)?|VllmWorker\w*(?: \w+)?|APIServer|ApiServer_\d+|Worker_TP\d+\w*|"
            r"RayWorkerVllm|AsyncVLLM\w*)(?: rank=\d+)? pid=\d+|\bVllmWorkerProcess\b|No module named '?vllm\b|"
            r"Engine core initialization failed|EngineCore failed to start|\bAsyncLLMEngine\b"
        ),
    ),
    ("vllm", WEAK, lazy_compile(r"(?:^|[/\\\s\"'])vllm[/\\]\w|\bVLLM_[A-Z][A-Z0-9_]+")),
    (
        "sglang",
        STRONG,
        lazy_compile(
            r"\bsglang\.(?:launch_server|srt|bench_\w+|check_env)\b|\b(?:sglang|SGLang)(?: version|==| v)\s?\d|"
            r"\bSGLang\b|\bsgl[-_]kernel\b|\(SGLangEngine pid=|\bTpModelWorker\b|"
            r"\bScheduler hit an exception\b|server_args=ServerArgs\(|No module named '?sglang\b"
        ),
    ),
    ("sglang", WEAK, lazy_compile(r"(?:^|[/\\\s\"'])sglang[/\\]\w|\bSGL(?:ANG)?_[A-Z][A-Z0-9_]+")),
)


# a version a line gives with the server's name (`vllm version 0.24.0`, `sglang==0.5.2`): the server's own
_VERSION = lazy_compile(
    r"\b(?P<server>vllm|sglang)(?: version|==| v)\s?(?P<version>\d+\.\d+\.\d+[\w.+-]*)", re.I
)


def _rule(server: str, weight: int) -> str:
    return f"server_{server}_{'strong' if weight == STRONG else 'weak'}"


# one rule per marker: the scan confirms only the markers its prefilter saw, so a traceback's frame lines (all
# of them under sglang/) cost one short search, not four long ones
_MARKER_RULES = tuple((_rule(server, weight), server, weight) for server, weight, _pattern in MARKERS)


def marker_rules() -> tuple[tuple[str, str, int], ...]:
    """(rule name, server, weight) of each marker, in the order a line's first marker is looked for."""
    return _MARKER_RULES


VERSION_PIECES = ("ersion", "ERSION", "==", " v", " V")  # what every named version holds


def _may_name_version(msg: str) -> bool:
    # VERSION_PIECES, unrolled
    return "ersion" in msg or "ERSION" in msg or "==" in msg or " v" in msg or " V" in msg


class ServerMentions:
    RULES: ClassVar[dict[str, str]] = {
        _rule(server, weight): pattern.pattern for server, weight, pattern in MARKERS
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs
        self.full: set[tuple[str, int]] = set()  # markers whose first lines are all kept

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        for rule, server, weight in _MARKER_RULES:
            if rule in hits:
                if (server, weight) not in self.full:
                    kept = self.obs.server_mentions.setdefault(server, [])
                    if sum(1 for w, _line, _text in kept if w == weight) < _KEEP:
                        kept.append((weight, line.number, line.msg.strip()[:300]))
                    else:
                        self.full.add((server, weight))
                break  # a line speaks for one server: the first marker it shows
        else:
            return False
        msg = line.msg
        if _may_name_version(msg):
            version = _VERSION.search(msg)
            if version is not None:
                self.obs.version(version.group("server").lower(), version.group("version"))
        return False

    def may_record(self, server: str, weight: int, msg: str) -> bool:
        """Whether a line with this marker may add anything: a mention while its first ones are not all kept,
        a version."""
        return (server, weight) not in self.full or _may_name_version(msg)

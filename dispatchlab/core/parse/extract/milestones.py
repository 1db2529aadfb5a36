"""Startup milestones of SGLang and vLLM: distributed init, weights, KV cache, CUDA graphs, ready.

Also tracks the phase each rank is in, which tells whether a load or KV line belongs to the draft model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import Origin
from dispatchlab.core.parse.observations import Announcement, Observations
from dispatchlab.core.parse.vocabulary import Phase
from dispatchlab.core.records import record

_CG_BEGIN = (
    r"^Capture (?P<what>[\w -]*?)graph begin(?: \(step (?P<step>\d+)\))?\."
    r"(?:.*?backend=(?P<backend>\w+))?(?:.*?(?:bs|num_tokens)=(?P<sizes>\[[^\]]*\]))?(?:.*?avail mem=(?P<avail>[\d.]+) GB)?"
)
_CG_END = (
    r"^Capture (?P<what>[\w -]*?)graph end(?: \(step \d+\))?\. (?:Time elapsed: (?P<t_old>[\d.]+) s|elapsed=(?P<t_new>[\d.]+) s)"
    r"(?:.*?mem usage=(?P<mem>-?[\d.]+) GB)?(?:.*?avail mem=(?P<avail>[\d.]+) GB)?"
)
_LOAD_END = (
    r"^Load weight end\. (?:elapsed=(?P<elapsed>[\d.]+) s, )?type=(?P<cls>\w+), (?:dtype=(?P<dtype>[\w.]+), )?"
    r"(?:quant=(?P<quant>[\w.-]+),[^a]*)?(?:avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<mem>-?[\d.]+) GB)?"
)
_KV_ALLOC = (
    r"^KV Cache is allocated\. (?:dtype: (?P<dtype>[\w.]+), )?(?:#tokens: (?P<tokens>\d+), )?"
    r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)?"
)
_MAX_TOTAL = (
    r"^max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None), "
    r"max_prefill_tokens=(?P<prefill>\d+), max_running_requests=(?P<running>\d+), context_len=(?P<ctx>\d+)"
)


@record
class _RankState:
    phase: Phase = Phase.INIT
    model: str = "main"
    capture_open: bool = False


class Milestones:
    RULES: ClassVar[dict[str, str]] = {
        "init_dist_begin": r"^Init torch distributed begin\.",
        "init_dist_end": r"^Init torch distributed ends\.",
        "load_begin": r"^Load weight begin\. avail mem=(?P<avail>[\d.]+) GB",
        "load_end": _LOAD_END,
        "kv_alloc": _KV_ALLOC,
        "mem_pool_end": r"^Memory pool end\. avail mem=(?P<avail>[\d.]+) GB",
        "cg_begin": _CG_BEGIN,
        "cg_end": _CG_END,
        "max_total": _MAX_TOTAL,
        "uvicorn_up": r"Uvicorn running on (?P<url>\S+)",
        "ready": r"The server is fired up and ready to roll!",
        "vllm_load_begin": r"^Starting to load model (?P<model>\S+?)\.*$",
        "vllm_load_end": r"^(?:Model loading took (?P<gib>[\d.]+) GiB|Loading weights took (?P<sec>[\d.]+) seconds)",
        "vllm_kv": r"^(?:Available KV cache memory: (?P<gib>[\d.]+) GiB|GPU KV cache size: (?P<tokens>[\d,]+) tokens)",
        "vllm_cg_progress": r"Capturing CUDA graphs? \(",
        "vllm_cg_end": r"^Graph capturing finished in (?P<sec>[\d.]+) secs?(?:, took (?P<gib>[\d.]+) GiB)?",
        "vllm_init_engine": r"^init engine \(profile, create kv cache, warmup model\) took (?P<sec>[\d.]+)",
        "vllm_ready": r"Starting vLLM (?:API )?server on|^Application startup complete\.|Available routes are:",
        "vllm_platform": r"Automatically detected platform (?P<platform>\w+)\.",
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs
        self.ranks: dict[str | None, _RankState] = {}

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        for table in (_SGLANG, _VLLM):
            handler = next((h for name, h in table if name in hits), None)
            if handler is not None:
                handler(self, line, hits)
        if "vllm_platform" in hits:
            self.obs.server_votes["vllm"] += 3
        return False

    def rank(self, rank: str | None) -> _RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = _RankState()
        return state

    def model_of(self, rank: str | None) -> str:
        """The model a rank is working on: the draft while its CUDA graphs are being captured."""
        state = self.ranks.get(rank)
        return state.model if state and state.phase == Phase.CUDA_GRAPH_CAPTURE else "main"

    def _enter(self, line: Line, name: str, phase: Phase, model: str = "main") -> None:
        self.obs.milestone(line, name, line.msg, model)
        state = self.rank(line.rank)
        state.phase = phase
        state.model = model

    def _weak_backend(self, key: str, value: str, line: Line) -> None:
        origin = Origin(value=value, source="message", line=line.number, text=line.msg[:500])
        self.obs.announcements.append(Announcement(key, origin, self.model_of(line.rank), True))

    def _load_begin(self, line: Line, hits: Hits) -> None:
        self._enter(line, "weights_begin", Phase.WEIGHT_LOADING, self.model_of(line.rank))

    def _load_end(self, line: Line, hits: Hits) -> None:
        quant = hits["load_end"].group("quant")
        if quant and quant not in ("None", "none"):
            self._weak_backend("quantization", quant, line)
        self._enter(line, "weights_end", Phase.KV_CACHE, self.model_of(line.rank))

    def _kv_alloc(self, line: Line, hits: Hits) -> None:
        dtype = hits["kv_alloc"].group("dtype")
        if dtype:
            self._weak_backend("kv_cache_dtype", dtype.replace("torch.", ""), line)
        self.obs.milestone(line, "kv_cache_allocated", line.msg, self.model_of(line.rank))

    def _capture_begin(self, line: Line, hits: Hits) -> None:
        model = "draft" if "draft" in (hits["cg_begin"].group("what") or "").lower() else "main"
        self.rank(line.rank).capture_open = True
        self._enter(line, "cuda_graph_begin", Phase.CUDA_GRAPH_CAPTURE, model)

    def _capture_end(self, line: Line, hits: Hits) -> None:
        what = hits["cg_end"].group("what") if "cg_end" in hits else ""
        model = "draft" if "draft" in (what or "").lower() else "main"
        self.rank(line.rank).capture_open = False
        self._enter(line, "cuda_graph_end", Phase.WARMUP, model)

    def _ready(self, line: Line, hits: Hits) -> None:
        self.obs.ready_line = self.obs.ready_line or line.number
        self._enter(line, "ready", Phase.SERVING)
        for state in self.ranks.values():
            state.phase = Phase.SERVING

    def _vllm_load_begin(self, line: Line, hits: Hits) -> None:
        self.obs.server_votes["vllm"] += 2
        self._enter(line, "weights_begin", Phase.WEIGHT_LOADING)
        if not self.obs.model:
            self.obs.model = hits["vllm_load_begin"].group("model").rstrip(".")

    def _vllm_capture_progress(self, line: Line, hits: Hits) -> None:
        state = self.rank(line.rank)
        if state.phase != Phase.CUDA_GRAPH_CAPTURE and not state.capture_open:
            state.capture_open = True
            self._enter(line, "cuda_graph_begin", Phase.CUDA_GRAPH_CAPTURE)

    def _vllm_ready(self, line: Line, hits: Hits) -> None:
        if self.obs.ready_line is None:
            self._ready(line, hits)


# one milestone per line for each server, the first that matches (class-level: a crash loop makes an extractor
# per run, and binding eighteen handlers each time was most of that)
_Handler = Callable[["Milestones", Line, Hits], None]
_SGLANG: list[tuple[str, _Handler]] = [
    ("init_dist_begin", lambda self, line, h: self._enter(line, "init_dist_begin", Phase.INIT)),
    ("init_dist_end", lambda self, line, h: self.obs.milestone(line, "init_dist_end", line.msg)),
    ("load_begin", lambda self, line, h: self._load_begin(line, h)),
    ("load_end", lambda self, line, h: self._load_end(line, h)),
    ("kv_alloc", lambda self, line, h: self._kv_alloc(line, h)),
    ("mem_pool_end", lambda self, line, h: self.obs.milestone(line, "memory_pool_end", line.msg)),
    ("cg_begin", lambda self, line, h: self._capture_begin(line, h)),
    ("cg_end", lambda self, line, h: self._capture_end(line, h)),
    ("max_total", lambda self, line, h: self._enter(line, "capacity", Phase.WARMUP)),
    ("uvicorn_up", lambda self, line, h: self.obs.milestone(line, "http_up", line.msg)),
    ("ready", lambda self, line, h: self._ready(line, h)),
]
_VLLM: list[tuple[str, _Handler]] = [
    ("vllm_load_begin", lambda self, line, h: self._vllm_load_begin(line, h)),
    ("vllm_load_end", lambda self, line, h: self._enter(line, "weights_end", Phase.KV_CACHE)),
    ("vllm_kv", lambda self, line, h: self._enter(line, "kv_cache_allocated", Phase.KV_CACHE)),
    ("vllm_cg_progress", lambda self, line, h: self._vllm_capture_progress(line, h)),
    ("vllm_cg_end", lambda self, line, h: self._capture_end(line, h)),
    ("vllm_init_engine", lambda self, line, h: self._enter(line, "engine_ready", Phase.WARMUP)),
    ("vllm_ready", lambda self, line, h: self._vllm_ready(line, h)),
]

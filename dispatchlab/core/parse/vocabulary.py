"""The words every stage shares: phases, milestones, caps, version keys, rank order, progress."""

from __future__ import annotations

import enum
from collections.abc import Callable

from dispatchlab.core.lazyre import lazy_compile

# progress(bytes_done, bytes_total): bytes_total is None when unknown (stdin, compressed input)
ProgressCallback = Callable[[int, int | None], None]


class Phase(enum.StrEnum):
    """Startup phases in the order a server goes through them."""

    INIT = "init"
    WEIGHT_LOADING = "weight_loading"
    KV_CACHE = "kv_cache"
    CUDA_GRAPH_CAPTURE = "cuda_graph_capture"
    WARMUP = "warmup"
    SERVING = "serving"


PHASE_ORDER: tuple[str, ...] = tuple(Phase)

# The phase a milestone starts (or keeps), for placing a crash between milestones.
MILESTONE_PHASE: dict[str, Phase] = {
    "init_dist_begin": Phase.INIT,
    "init_dist_end": Phase.INIT,
    "weights_begin": Phase.WEIGHT_LOADING,
    "weights_end": Phase.KV_CACHE,
    "kv_cache_allocated": Phase.KV_CACHE,
    "memory_pool_end": Phase.KV_CACHE,
    "cuda_graph_begin": Phase.CUDA_GRAPH_CAPTURE,
    "cuda_graph_end": Phase.WARMUP,
    "capacity": Phase.WARMUP,
    "http_up": Phase.WARMUP,
    "engine_ready": Phase.WARMUP,
    "ready": Phase.SERVING,
}
# Milestones that prove a process went on after an error it printed.
PROGRESS_MILESTONES = frozenset(
    {
        "weights_begin",
        "weights_end",
        "kv_cache_allocated",
        "memory_pool_end",
        "cuda_graph_begin",
        "cuda_graph_end",
        "capacity",
        "http_up",
        "engine_ready",
        "ready",
    }
)

# Packages whose versions the document reports (`versions`), and that signature conditions may name.
VERSION_KEYS = ("sglang", "vllm", "flashinfer", "torch", "triton", "sgl_kernel", "cuda", "driver", "nccl")

# Error kinds that report a failure without being it (a request that failed, a child's sigquit, ...).
NOT_FAILURE_EVIDENCE = ("sigquit", "init_failed", "exception", "error", "request_error", "garbage_output")

# Caps that keep a document small whatever the log holds.
MAX_TIMELINE_EVENTS = 4000
# a crash loop's runs listed: the first and the last half of this; the runs between are counted by how they ended
MAX_RUNS_LISTED = 200
MAX_TRACEBACKS = 200
MAX_FRAMES = 80
MAX_HITS_PER_PATTERN = 25
MAX_MESSAGE = 2000
MAX_NCCL_TRANSPORTS = 256
MAX_KERNELS = 100
MAX_ERRORS = 500
MAX_WARNING_EVENTS = 300
METRIC_POINTS_TARGET = 1500

_NUMBERS = lazy_compile(r"0x[0-9a-fA-F]+|\d+")


def without_numbers(text: str, limit: int) -> str:
    """The text with addresses and numbers blanked: the same message from another rank or step."""
    return _NUMBERS.sub("#", text)[:limit]


def rank_sort_key(rank: str | None) -> tuple[tuple[int, int | str], ...]:
    """Ranks in the order people count them: number by number (DP0 TP3 before DP0 TP12 before DP1 TP0),
    no rank first."""
    if not rank:
        return ()
    return tuple(
        (0, int(part)) if part.isascii() and part.isdigit() else (1, part)
        for part in _DIGITS.split(rank)
        if part
    )


_DIGITS = lazy_compile(r"([0-9]+)")

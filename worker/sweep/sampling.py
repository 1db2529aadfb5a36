"""The sampling candidates: top-k renormalisation of the probabilities, SGLang's pytorch path and
FlashInfer's top_k_renorm_probs, against a float32 topk/scatter reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.probes.harness import import_once
from worker.sweep.harness import (
    Run,
    SweepEntry,
    check,
    need_flashinfer,
    need_gpu,
    probe_context,
    rate,
    time_ms,
)


def sampling_inputs(run: Run) -> Any:
    torch = run.torch
    gen = torch.Generator(device=run.device).manual_seed(0)
    vocab = 32768 if run.device == "cuda" else 4096
    return (torch.randn(run.shapes["tokens"], vocab, generator=gen, device=run.device) * 3).softmax(dim=-1)


TOP_K = 50


def top_k_renorm_ref(torch: Any, probs: Any) -> Any:
    values, idx = probs.float().topk(TOP_K, dim=-1)
    out = torch.zeros_like(probs, dtype=torch.float32)
    return out.scatter_(-1, idx, values / values.sum(dim=-1, keepdim=True))


def _sampling_torch(run: Run, e: SweepEntry, probs: Any, ref: Any) -> None:
    """SGLang's pytorch path: sort, keep the first TOP_K, renormalise (not the reference's topk/scatter)."""
    torch = run.torch

    def call() -> Any:
        ordered, idx = probs.sort(dim=-1, descending=True)
        keep = torch.arange(probs.shape[-1], device=probs.device) < TOP_K
        kept = ordered * keep
        return torch.zeros_like(probs).scatter_(-1, idx, kept / kept.sum(dim=-1, keepdim=True))

    check(e, call(), ref)
    rate(run, e, time_ms(run, call), nbytes=2.0 * probs.numel() * 4, metric="memory")


def _sampling_flashinfer(run: Run, e: SweepEntry, probs: Any, ref: Any) -> None:
    need_flashinfer()
    need_gpu(run)
    sampling = import_once(probe_context(run), "flashinfer.sampling")

    def call() -> Any:
        return sampling.top_k_renorm_probs(probs, TOP_K)

    check(e, call(), ref)
    rate(run, e, time_ms(run, call), nbytes=2.0 * probs.numel() * 4, metric="memory")


SAMPLING_CANDIDATES: list[tuple[str, str, str | None, Callable[[Run, SweepEntry, Any, Any], None]]] = [
    ("pytorch", "torch top-k renorm", "pytorch", _sampling_torch),
    ("flashinfer", "flashinfer top_k_renorm_probs", "flashinfer", _sampling_flashinfer),
]

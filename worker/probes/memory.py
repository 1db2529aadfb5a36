"""The memory probe: a device-to-device copy, checked exactly, in GB/s against the HBM datasheet figure."""

from __future__ import annotations

from worker.probes import harness
from worker.probes.harness import Context, ProbeResult, ProbeStatus, free_gib

COPY_BYTES = 2 << 30  # or a quarter of the free memory, when less


def memory_copy(ctx: Context, r: ProbeResult) -> None:
    torch = ctx.torch
    nbytes = min(COPY_BYTES, int(free_gib(ctx) * (1 << 30) / 4)) // 4 * 4
    r.shape = {"bytes": nbytes, "counted": "read + written"}
    src = torch.randn(nbytes // 4, device=harness.DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if ctx.perturb:  # the control run: one wrong element must fail an exact copy
        dst[0] += 1.0
        r.extra["perturbed"] = "one element of the copy changed before the check"
    exact = bool(torch.equal(dst, src))  # a copy is exact; no float temporaries the size of the buffer
    r.checked, r.matched_ratio = True, 1.0 if exact else float((dst == src).float().mean().item())
    r.max_error = r.max_rel_error = 0.0 if exact else float((dst - src).abs().max().item())
    r.status = ProbeStatus.PASSED if exact else ProbeStatus.INCORRECT_NUMERICAL
    harness.measure(ctx, r, lambda: dst.copy_(src), nbytes=2.0 * nbytes, metric="memory")

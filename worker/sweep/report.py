"""Ranking and proposing: correct candidates by time, the fastest one the server's flag accepts as the
proposed fix, and the sweep's table for people."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from dispatchlab.core.flags import release_for
from worker.probes.harness import ATOL
from worker.sweep.harness import SweepEntry, SweepReport


class SweepComponent(StrEnum):
    MOE = "moe"
    ATTENTION = "attention"
    GEMM = "gemm"
    SAMPLING = "sampling"


# The server flag each component's winner is proposed for (SGLang spelling; the catalog checks the value).
FLAG_FOR = {
    SweepComponent.MOE: "--moe-runner-backend",
    SweepComponent.ATTENTION: "--attention-backend",
    SweepComponent.GEMM: "--fp8-gemm-backend",
    SweepComponent.SAMPLING: "--sampling-backend",
}


def rank(entries: list[SweepEntry]) -> list[SweepEntry]:
    """Correct candidates by time, fastest first (rank 1, 2, ...); the rest after, unranked."""
    correct = sorted(
        (e for e in entries if e.correct and e.result.ms is not None), key=lambda e: e.result.ms or 0.0
    )
    for position, e in enumerate(correct, start=1):
        e.rank = position
    return correct + [e for e in entries if e not in correct]


# Candidates that are ours, not the server's kernel behind the flag value they map to: their run shows the
# library works on this arch, their speed is not the server's.
STAND_INS = {
    "triton": "the repro's own Triton MoE kernel stands in for the server's fused_moe_triton: it shows Triton "
    "MoE compiles and is correct on this GPU, not how fast the server's kernel is"
}


def propose(
    component: SweepComponent, ranked: list[SweepEntry], server: str = "sglang"
) -> dict[str, Any] | None:
    """The fastest correct candidate the server's flag accepts (per its catalog)."""
    flag = FLAG_FOR[component]
    spec = release_for(server, None).get(flag) or {}
    choices = spec.get("choices") or []
    for e in ranked:
        if e.rank is None or e.flag_value is None:
            continue
        if choices and e.flag_value not in choices:
            continue
        dest = spec.get("dest") or flag.lstrip("-").replace("-", "_")
        return {
            "candidate": e.result.name,
            "flag": flag,
            "value": e.flag_value,
            "args_patch": {dest: e.flag_value},
            "ms": e.result.ms,
            "why": f"fastest correct candidate with a {server} value for {flag} (rank {e.rank})"
            + (f"; a stand-in: {STAND_INS[e.result.name]}" if e.result.name in STAND_INS else ""),
            "stand_in": e.result.name in STAND_INS,
        }
    return None


def table_lines(report: SweepReport) -> list[str]:
    head = [
        "rank",
        "candidate",
        "flag value",
        "status",
        "checked",
        "max err",
        "ms",
        "rate",
        "% peak",
        "% anchor",
        "jit",
        "error",
    ]
    rows = [head]
    for e in report.entries:
        r = e.result
        rate = (
            f"{r.tflops:g} TFLOP/s"
            if r.tflops is not None
            else ("-" if r.gbps is None else f"{r.gbps:g} GB/s")
        )
        checked = "-" if not r.checked else f"{(r.matched_ratio or 0) * 100:.1f}%"
        rows.append(
            [
                "-" if e.rank is None else str(e.rank),
                r.name,
                e.flag_value or "(baseline)",
                str(r.status) if r.checked or not r.runs else "unchecked",
                checked,
                "-" if r.max_error is None else f"{r.max_error:.3g}",
                "-" if r.ms is None else f"{r.ms:.3f}",
                rate,
                "-" if r.peak_fraction is None else f"{r.peak_fraction * 100:.0f}%",
                "-" if e.anchor_fraction is None else f"{e.anchor_fraction * 100:.0f}%",
                (f"{e.jit.get('state')} {e.jit.get('seconds', '')}s" if e.jit else "-"),
                (r.error or "")[:140],
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
    lines = [
        f"{report.component} sweep on {report.gpu or 'CPU'} {report.arch or ''} ({report.hostname}); {report.timing}",
        f"shapes per rank: {report.shapes}; read: {', '.join(report.provenance.get('read', [])) or 'none'};"
        f" inferred: {', '.join(report.provenance.get('inferred', [])) or 'none'};"
        f" defaulted: {', '.join(report.provenance.get('defaulted', [])) or 'none'}",
        f"tolerance atol=rtol={ATOL:g}, whole output against a float32 torch reference",
    ]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    fix = report.proposed_fix
    lines.append(
        f"proposed fix: {fix['flag']} {fix['value']} ({fix['why']})"
        if fix
        else "proposed fix: none (no correct candidate with a server flag value)"
    )
    lines += [f"note: {n}" for n in report.notes]
    return lines

"""Kernel probes: does a kernel run on this GPU, is it right, and how fast is it against the datasheet.

Each probe runs one kernel the way an inference server would (cuBLAS GEMMs, scaled FP8/FP4 GEMMs, SDPA
backends, a Triton JIT kernel, MoE grouped GEMMs, FlashInfer attention and fused MoE) and returns a
`ProbeResult` shaped like a flashinfer-bench evaluation: a status (PASSED, INCORRECT_NUMERICAL,
UNCHECKED, RUNTIME_ERROR, UNSUPPORTED_ARCH, COMPILE_ERROR, MISSING_ARTIFACTS, NOT_INSTALLED, SKIPPED,
TIMEOUT), the first line of the
exception a refusing kernel raised, the max absolute and relative error against a torch reference
(atol = rtol = 1e-2; an element fails only past both; 100% must match, 95% for MoE), the median latency
over CUDA events after warm-ups (a short burst; a ~200 ms sustained run and the SM clocks in `extra`),
TFLOP/s or GB/s, and the fraction of the datasheet peak (worker.peaks).

PASSED means the output was compared with the reference and matched: a probe that ran to the end without
comparing anything is UNCHECKED. A probe whose kernel FlashInfer downloads at first use (trtllm-gen) answers
MISSING_ARTIFACTS at once, with the fix, where `worker.inventory.flashinfer_artifacts()` finds neither the
cubins nor the download host, instead of waiting on FlashInfer's download retries. `perturb=True` (the
CLI's --perturb) is a control run: every checked output is pushed past the tolerance before the
comparison, so every checked probe must then say INCORRECT_NUMERICAL.

A probe never raises. Without torch, a GPU, Triton or FlashInfer the probes say so (NOT_INSTALLED,
SKIPPED); GPU memory is freed between probes; if one probe leaves the CUDA context broken (an illegal
address is sticky), the probes after it run in a fresh process. torch, triton and flashinfer are imported
inside the functions that use them.

The package: `harness` (results, statuses, timing, checking, running one probe; the backend sweep uses
it too), one module per component (`gemm`, `attention`, `moe`, `memory`, `jit`; the communication
component, the multi-process NCCL all-reduce, is worker.allreduce over `communication`), and here the
registry and the run over it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from worker.inventory import ArtifactStatus
from worker.probes.attention import flashinfer_decode, flashinfer_prefill, sdpa
from worker.probes.gemm import gemm_bf16, gemm_fp4, gemm_fp8
from worker.probes.harness import (
    ATOL,
    DEFAULT_JIT_TIMEOUT_S,
    MODEL_SHAPES_ENV,
    RAN,
    RTOL,
    Component,
    Context,
    ModelShapes,
    Probe,
    ProbeFn,
    ProbeResult,
    ProbeStatus,
    context_broken,
    error_line,
    open_context,
    run_one,
)
from worker.probes.jit import triton_matmul
from worker.probes.memory import memory_copy
from worker.probes.moe import flashinfer_cutlass_moe, flashinfer_trtllm_moe_fp4, moe_grouped_mm

__all__ = [
    "ATOL",
    "DEFAULT_JIT_TIMEOUT_S",
    "MODEL_SHAPES_ENV",
    "PROBES",
    "RAN",
    "RTOL",
    "Component",
    "Context",
    "ModelShapes",
    "Probe",
    "ProbeFn",
    "ProbeResult",
    "ProbeStatus",
    "model_shapes_from_env",
    "open_context",
    "probe_catalog",
    "probe_names",
    "probes_for_component",
    "run_one",
    "run_probes",
    "table_lines",
]

# ---------------------------------------------------------------- the registry

_SM100 = frozenset({(10, 0), (10, 3)})

PROBES: dict[str, Probe] = {
    p.name: p
    for p in [
        Probe("gemm_bf16", "cublas", Component.GEMM, "bf16 matmul 8192^3 (torch.mm)", gemm_bf16),
        Probe(
            "gemm_fp8",
            "cublaslt",
            Component.GEMM,
            "FP8 e4m3 torch._scaled_mm 8192^3, per-tensor scales",
            gemm_fp8(fast_accum=False),
            min_capability=(8, 9),
        ),
        Probe(
            "gemm_fp8_fast_accum",
            "cublaslt",
            Component.GEMM,
            "the same with use_fast_accum=True, as serving stacks pass on Hopper (on an H200 its coarser "
            "accumulation misses atol=rtol=1e-2 on ~2% of outputs at k=8192)",
            gemm_fp8(fast_accum=True),
            min_capability=(8, 9),
        ),
        Probe(
            "gemm_mxfp4",
            "torch.nn.functional.scaled_mm",
            Component.GEMM,
            "MXFP4 block-scaled matmul 8192^3 (E2M1 data, E8M0 scales per 32)",
            gemm_fp4("mxfp4"),
            min_capability=(10, 0),
        ),
        Probe(
            "gemm_nvfp4",
            "torch.nn.functional.scaled_mm",
            Component.GEMM,
            "NVFP4 block-scaled matmul 8192^3 (E2M1 data, E4M3 scales per 16)",
            gemm_fp4("nvfp4"),
            min_capability=(10, 0),
        ),
        Probe("memory_copy", "torch", Component.MEMORY, "device-to-device copy of 2 GiB", memory_copy),
        *(
            Probe(
                f"sdpa_{short}",
                short,
                Component.ATTENTION,
                f"torch SDPA {backend} backend, causal, 8x32x4096x128 bf16",
                sdpa(backend),
            )
            for short, backend in [
                ("cudnn", "CUDNN_ATTENTION"),
                ("flash", "FLASH_ATTENTION"),
                ("efficient", "EFFICIENT_ATTENTION"),
                ("math", "MATH"),
            ]
        ),
        Probe(
            "triton_matmul",
            "triton",
            Component.JIT,
            "a Triton bf16 matmul compiled for this GPU (compile time, target)",
            triton_matmul,
            needs="triton",
        ),
        Probe(
            "moe_grouped_mm",
            "torch._grouped_mm",
            Component.MOE,
            "bf16 MoE layer (route, gate/up, SiLU, down, combine) at the model's shapes",
            moe_grouped_mm,
        ),
        Probe(
            "flashinfer_decode",
            "flashinfer",
            Component.ATTENTION,
            "FlashInfer single_decode_with_kv_cache, GQA, 64K tokens of KV",
            flashinfer_decode,
            needs="flashinfer",
        ),
        Probe(
            "flashinfer_prefill",
            "flashinfer",
            Component.ATTENTION,
            "FlashInfer single_prefill_with_kv_cache, causal, 8192 tokens (backend auto)",
            flashinfer_prefill,
            needs="flashinfer",
        ),
        Probe(
            "flashinfer_cutlass_moe",
            "flashinfer_cutlass",
            Component.MOE,
            "FlashInfer cutlass_fused_moe, bf16, at the model's shapes",
            flashinfer_cutlass_moe,
            needs="flashinfer",
        ),
        Probe(
            "flashinfer_trtllm_moe_fp4",
            "flashinfer_trtllm",
            Component.MOE,
            "FlashInfer trtllm-gen trtllm_fp4_block_scale_moe (MXFP4 weights, bf16 activations)",
            flashinfer_trtllm_moe_fp4,
            needs="flashinfer",
            capabilities=_SM100,
            downloads=True,
        ),
    ]
}


def probe_names() -> list[str]:
    return list(PROBES)


def probes_for_component(component: str) -> list[str]:
    wanted = _component(component)
    return [name for name, probe in PROBES.items() if probe.component == wanted]


def probe_catalog() -> list[dict[str, str]]:
    return [
        {"name": p.name, "backend": p.backend, "component": str(p.component), "description": p.description}
        for p in PROBES.values()
    ]


def _component(component: str) -> Component:
    try:
        return Component(component)
    except ValueError:
        raise ValueError(
            f"unknown component {component!r}: one of {', '.join(c.value for c in Component)}"
        ) from None


def model_shapes_from_env() -> dict[str, Any] | None:
    """The model shapes a launcher passes in DISPATCHLAB_PROBE_MODEL_SHAPES (a JSON object)."""
    raw = os.environ.get(MODEL_SHAPES_ENV)
    if not raw:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{MODEL_SHAPES_ENV} must hold a JSON object")
    return data


def run_probes(
    names: Iterable[str] | None = None,
    *,
    model_shapes: Mapping[str, Any] | None = None,
    component: str | None = None,
    jit_timeout_s: float = DEFAULT_JIT_TIMEOUT_S,
    artifacts: ArtifactStatus | None = None,
    perturb: bool = False,
) -> list[ProbeResult]:
    """Run the named probes (all when None), optionally only those of one component, in registry order.
    Unknown names, components or shapes raise ValueError before anything runs; the probes never raise.
    `artifacts` is the host's FlashInfer artifact status when already known (else looked up when a probe
    needs it); `perturb` makes this a control run (see the module's docstring)."""
    selected = _select(names, component)
    shapes = ModelShapes.from_mapping(model_shapes)
    if not selected:
        return []
    ctx = open_context(shapes, jit_timeout_s)
    ctx.artifacts, ctx.perturb = artifacts, perturb
    results: list[ProbeResult] = []
    for index, name in enumerate(selected):
        result = run_one(PROBES[name], ctx)
        results.append(result)
        broken = context_broken(ctx)
        if broken and index + 1 < len(selected):
            results += _run_rest_in_child(
                selected[index + 1 :], shapes, jit_timeout_s, name, broken, perturb=perturb
            )
            break
    return results


def _select(names: Iterable[str] | None, component: str | None) -> list[str]:
    chosen = list(PROBES) if names is None else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in PROBES]
    if unknown:
        raise ValueError(f"unknown probe {', '.join(unknown)}: one of {', '.join(PROBES)}")
    if component is not None:
        wanted = _component(component)
        chosen = [n for n in chosen if PROBES[n].component == wanted]
    order = list(PROBES)
    return sorted(chosen, key=order.index)


def _run_rest_in_child(
    names: list[str], shapes: ModelShapes, jit_timeout_s: float, culprit: str, broken: str, *, perturb: bool
) -> list[ProbeResult]:
    argv = [sys.executable, "-m", "worker", "probe", "--json", "--jit-timeout", str(jit_timeout_s), *names]
    if perturb:
        argv.append("--perturb")
    env = dict(os.environ, **{MODEL_SHAPES_ENV: json.dumps(asdict(shapes))})
    try:
        done = subprocess.run(
            argv,
            cwd=Path(__file__).resolve().parents[2],  # the repository root
            env=env,
            capture_output=True,
            text=True,
            timeout=max(600.0, jit_timeout_s + 600.0),
            check=False,
        )
        data = json.loads(done.stdout)
        return [ProbeResult.from_dict(p) for p in data["probes"]]
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError, OSError) as error:
        why = f"the CUDA context broke after {culprit} ({broken}) and a fresh process failed: {error_line(error)}"
        return [
            ProbeResult(n, PROBES[n].backend, str(PROBES[n].component), ProbeStatus.RUNTIME_ERROR, error=why)
            for n in names
        ]


def table_lines(results: list[ProbeResult]) -> list[str]:
    """A short table: name, backend, status, ms, TFLOP/s or GB/s, % of peak, then the error if any."""
    rows = [["probe", "backend", "status", "ms", "rate", "% peak", "error"]]
    for r in results:
        if r.tflops is not None:
            rate = f"{r.tflops:g} TFLOP/s"
        else:
            rate = "-" if r.gbps is None else f"{r.gbps:g} GB/s"
        peak = "-" if r.peak_fraction is None else f"{r.peak_fraction * 100:.0f}%"
        ms = "-" if r.ms is None else f"{r.ms:.3f}"
        rows.append([r.name, r.backend, str(r.status), ms, rate, peak, (r.error or "")[:120]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines

"""The backend sweep: every candidate backend installed on this host for the component a crash names,
run at the model's shapes read from the log, each checked against a float32 torch reference on its whole
output and timed, ranked; the fastest correct one that the server can be told to use is the proposed fix.

    python -m worker sweep REPORT_OR_LOG --component moe|attention|gemm|sampling [--out F] [--json]

Checking reuses worker.probes' rule (atol = rtol = 1e-2, an element fails only past both; 100% of the
output must match, 95% for MoE). Timing: CUDA events after warm-ups, the median of REPEATS calls; on a
host without a GPU, time.perf_counter around each call (CPU figures say nothing about a GPU). Rates go
against the datasheet peak (worker.peaks) and, where one was measured, the achievable anchor of that GPU
(ACHIEVABLE: H200 bf16 GEMM ~790 TFLOP/s, FP8 ~1440, copy ~4300 GB/s, bench/gpu_probes.py). A candidate
that refuses (import error, arch refusal, missing cubins on an offline host) is recorded with the library's
own message; FlashInfer JIT builds with their state (cached, built in N s, building: timed out) in a
persistent cache (DISPATCHLAB_JIT_CACHE, default ~/.cache/dispatchlab/jit). torch, triton and flashinfer
are imported lazily.

The package: `harness` (entries, the report, timing, checking, running one candidate), one module of
candidates per component (`moe`, `attention`, `gemm`, `sampling`), `report` (rank, propose, the table),
and here the run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import socket
from pathlib import Path
from typing import Any

from dispatchlab.core.shapes import ModelShapesRead, read_shapes_file, read_shapes_from_document
from worker.probes.harness import ProbeResult
from worker.sweep.attention import ATTENTION_CANDIDATES, attention_inputs, attention_reference
from worker.sweep.gemm import GEMM_CANDIDATES, gemm_inputs
from worker.sweep.harness import (
    DEFAULT_JIT_TIMEOUT_S,
    REPEATS,
    WARMUP,
    Run,
    SweepEntry,
    SweepReport,
    check,
    jit_cache_dirs,
    run_candidate,
)
from worker.sweep.moe import MOE_CANDIDATES, moe_inputs, moe_loop
from worker.sweep.report import FLAG_FOR, STAND_INS, SweepComponent, propose, rank, table_lines
from worker.sweep.sampling import SAMPLING_CANDIDATES, sampling_inputs, top_k_renorm_ref

__all__ = [
    "FLAG_FOR",
    "STAND_INS",
    "SweepComponent",
    "SweepEntry",
    "SweepReport",
    "check",
    "jit_cache_dirs",
    "propose",
    "rank",
    "run_sweep",
    "shapes_from_source",
    "table_lines",
]

DEFAULT_TOKENS = 4096  # MoE tokens per call, attention sequence length on GPU
CPU_TOKENS = 64  # on CPU: the torch candidates only show they run and are right


def shapes_from_source(path: Path) -> ModelShapesRead:
    """A log's shapes, or a report document's (`dispatchlab report --json`): its args dump and any config
    it carries are turned back into the lines the reader knows."""
    if path.suffix != ".json":
        return read_shapes_file(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise ValueError("a report's JSON document is an object")
    return read_shapes_from_document(document)


def _start(shapes: dict[str, int], dtype_name: str, jit_timeout_s: float) -> Run:
    torch: Any = importlib.import_module("torch")
    device, gpu, arch, capability = "cpu", None, None, (0, 0)
    with contextlib.suppress(Exception):
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            device, gpu, capability = "cuda", torch.cuda.get_device_name(), (int(major), int(minor))
            arch = f"sm_{major}{minor}"
    dtype = getattr(torch, dtype_name if dtype_name in ("bfloat16", "float16", "float32") else "bfloat16")
    return Run(torch, device, gpu, arch, capability, shapes, dtype, jit_timeout_s)


def run_sweep(
    component: str,
    read: ModelShapesRead,
    *,
    tokens: int | None = None,
    jit_timeout_s: float = DEFAULT_JIT_TIMEOUT_S,
    only: list[str] | None = None,
    source: str = "",
) -> SweepReport:
    """Run every candidate of `component` at the per-rank shapes of `read`; never raises for a
    candidate's failure (an unknown component raises ValueError before anything runs)."""
    kind = SweepComponent(component)
    caches = jit_cache_dirs()
    shapes = dict(read.per_rank())
    dtype_name = str(read.value("dtype") or "bfloat16")
    run = _start(shapes, dtype_name, jit_timeout_s)
    shapes["tokens"] = tokens or (DEFAULT_TOKENS if run.device == "cuda" else CPU_TOKENS)
    notes: list[str] = []
    if dtype_name not in ("bfloat16", "float16", "float32"):
        notes.append(f"the model's dtype {dtype_name} is not swept: candidates run in bfloat16")
    quant = read.value("quantization")
    if quant:
        notes.append(
            f"the checkpoint is quantized ({quant}); the MoE and GEMM candidates run bf16 weights unless named"
        )
    if run.device != "cuda":
        notes.append("no GPU: CPU timings (perf_counter) rank the torch candidates only; no % of peak")
    table, inputs, ref, required = _prepare(kind, run)
    entries: list[SweepEntry] = []
    for name, backend, flag_value, fn in table:
        if only and name not in only:
            continue
        result = ProbeResult(name, backend, str(kind), arch=run.arch, gpu=run.gpu, shape=dict(shapes))
        e = SweepEntry(result, flag_value=flag_value, required=required)
        run_candidate(run, e, fn, inputs, ref)
        entries.append(e)
    ranked = rank(entries)
    return SweepReport(
        component=str(kind),
        device=run.device,
        gpu=run.gpu,
        arch=run.arch,
        hostname=socket.gethostname(),
        shapes=shapes,
        provenance=read.to_dict(),
        timing=(
            f"CUDA events, median of {REPEATS} after {WARMUP} warm-ups"
            if run.device == "cuda"
            else f"time.perf_counter, median of {REPEATS} after {WARMUP} warm-ups (CPU)"
        ),
        entries=ranked,
        proposed_fix=propose(kind, ranked),
        jit_cache=caches,
        source=source,
        notes=notes,
    )


def _prepare(kind: SweepComponent, run: Run) -> tuple[list[Any], Any, Any, float]:
    torch = run.torch
    if kind == SweepComponent.MOE:
        m = moe_inputs(run)
        return MOE_CANDIDATES, m, moe_loop(torch, m, dtype=torch.float32), 0.95
    if kind == SweepComponent.ATTENTION:
        qkv = attention_inputs(run)
        return ATTENTION_CANDIDATES, qkv, attention_reference(run, *qkv), 1.0
    if kind == SweepComponent.GEMM:
        a, b = gemm_inputs(run)
        return GEMM_CANDIDATES, (a, b), a.float() @ b.float(), 1.0
    probs = sampling_inputs(run)
    return SAMPLING_CANDIDATES, probs, top_k_renorm_ref(torch, probs), 1.0

"""The JIT probe: a Triton bf16 matmul compiled for this GPU on every run (compile time, the target it
compiled for), checked on CHECK_ROWS rows against a float32 torch matmul."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker.probes import harness
from worker.probes.harness import Context, ProbeResult

TRITON_N = 4096

_TRITON_SOURCE = """
import triton
import triton.language as tl


@triton.jit
def probe_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                 stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SALT: tl.constexpr):
    # SALT only changes the specialisation key, so that every probe run really compiles.
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    a_tile = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        acc += tl.dot(tl.load(a_tile), tl.load(b_tile))
        a_tile += BK * stride_ak
        b_tile += BK * stride_bk
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(tl.bfloat16))
"""


@contextlib.contextmanager
def _module_from_source(source: str) -> Iterator[Any]:
    """Import `source` from a real file (Triton reads a kernel's source through inspect)."""
    name = f"_dispatchlab_probe_{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.py"
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
            yield module
        finally:
            sys.modules.pop(name, None)


def triton_matmul(ctx: Context, r: ProbeResult) -> None:
    torch, n, bm, bn, bk = ctx.torch, TRITON_N, 128, 128, 64
    triton = importlib.import_module("triton")
    r.extra["triton"] = getattr(triton, "__version__", None)
    r.shape = {"m": n, "n": n, "k": n, "dtype": "bfloat16", "tile": [bm, bn, bk]}
    a = torch.randn(n, n, device=harness.DEVICE, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=harness.DEVICE, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=harness.DEVICE, dtype=torch.bfloat16)
    with _module_from_source(_TRITON_SOURCE) as module:
        salt = int.from_bytes(os.urandom(4), "little")

        def run() -> Any:
            return module.probe_matmul[(n // bm, n // bn)](
                a, b, c, n, n, n, *a.stride(), *b.stride(), *c.stride(),
                BM=bm, BN=bn, BK=bk, SALT=salt, num_warps=8, num_stages=3,
            )  # fmt: skip

        start = time.perf_counter()
        compiled = run()
        torch.cuda.synchronize()
        r.extra["compile_s"] = round(time.perf_counter() - start, 3)
        r.extra.update(_triton_target(triton, compiled))
        harness.check_output(ctx, r, c[: harness.CHECK_ROWS], a[: harness.CHECK_ROWS].float() @ b.float())
        harness.measure(ctx, r, run, flops=2.0 * n**3, metric="bf16")


def _triton_target(triton: Any, compiled: Any) -> dict[str, Any]:
    """What Triton compiled for: the PTX `.target` (sm_90a) and its GPUTarget."""
    found: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        found["target"] = str(triton.runtime.driver.active.get_current_target())
    with contextlib.suppress(Exception):
        target = re.search(r"^\s*\.target\s+(\w+)", compiled.asm["ptx"], re.M)
        found["compiled_for"] = target.group(1) if target else None
    with contextlib.suppress(Exception):
        found["target"] = str(compiled.metadata.target)
    return found

"""The probes' arithmetic and their checks, run for real on this CPU: the FLOPs and bytes each probe counts,
the units and the share of the datasheet peak against figures worked out by hand, and the tolerance shown
to bite: a kernel whose output is off says INCORRECT_NUMERICAL, never PASSED, and a probe that compares
nothing says UNCHECKED."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.needs import require_torch
from worker import probes
from worker.probes import PROBES, ModelShapes, ProbeResult, ProbeStatus, attention, gemm, harness, memory, moe


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


class CpuTorch:
    """torch on the CPU, answering the few torch.cuda calls the probes make; `overrides` replace torch
    functions (a wrong kernel)."""

    def __init__(self, **overrides: Any) -> None:
        import torch

        self._torch = torch
        self._overrides = overrides
        self.cuda = SimpleNamespace(
            mem_get_info=lambda: (64 << 30, 80 << 30), synchronize=lambda: None, empty_cache=lambda: None
        )

    def __getattr__(self, name: str) -> Any:
        return self._overrides.get(name) or getattr(self._torch, name)


MS = 2.0  # the latency every timed run is given here: the arithmetic, not the CPU, is under test


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Probes run on the CPU at small sizes; timing is replaced by MS, and what they count is recorded."""
    seen: dict[str, Any] = {}

    def measure(ctx: Any, r: ProbeResult, fn: Any, *, flops: float = 0.0, nbytes: float = 0.0, metric: str):
        fn()
        seen.update(flops=flops, nbytes=nbytes, metric=metric)
        harness.rate(ctx, r, MS, flops=flops, nbytes=nbytes, metric=metric)

    monkeypatch.setattr(harness, "DEVICE", "cpu")
    monkeypatch.setattr(gemm, "GEMM_N", 64)
    monkeypatch.setattr(harness, "CHECK_ROWS", 16)
    monkeypatch.setattr(memory, "COPY_BYTES", 4 << 20)
    monkeypatch.setattr(attention, "SDPA_SHAPE", (1, 2, 64, 16))
    monkeypatch.setattr(harness, "measure", measure)
    return seen


SMALL_MOE = ModelShapes(hidden_size=64, moe_intermediate_size=32, num_experts=8, top_k=2, tokens=64)


def run(
    name: str, torch: Any = None, *, perturb: bool = False, shapes: ModelShapes = SMALL_MOE
) -> ProbeResult:
    ctx = probes.Context(
        torch=torch or CpuTorch(),
        gpu="NVIDIA H200",
        arch="sm_90",
        capability=(9, 0),
        shapes=shapes,
        perturb=perturb,
    )
    return probes.run_one(PROBES[name], ctx)


# ---------------------------------------------------------------- arithmetic, by hand


def test_a_gemm_counts_2mnk_flops_and_reports_tflops_and_share_of_the_h200_bf16_peak(on_cpu):
    result = run("gemm_bf16")
    assert result.status == ProbeStatus.PASSED, result.error
    assert on_cpu == {"flops": 524288.0, "nbytes": 0.0, "metric": "bf16"}  # 2 * 64^3
    # 524288 FLOP in 2 ms = 2.62e8 FLOP/s = 0.000262 TFLOP/s, shown to one decimal.
    assert (result.ms, result.tflops, result.gbps) == (2.0, 0.0, None)
    # At the real size: 2 * 8192^3 = 1.0995e12 FLOP in 1.389 ms = 791.6 TFLOP/s = 80.0% of 989.
    r = ProbeResult("gemm_bf16", "cublas", "gemm")
    harness.rate(run_ctx(), r, 1.389, flops=2.0 * 8192**3, metric="bf16")
    assert (r.tflops, r.peak_fraction, r.extra["peak_metric"]) == (791.6, 0.8, "bf16")


def run_ctx() -> Any:
    return probes.Context(gpu="NVIDIA H200", arch="sm_90", capability=(9, 0))


def test_a_copy_counts_bytes_read_and_written_in_gb_per_s_against_hbm(on_cpu):
    result = run("memory_copy")
    assert result.status == ProbeStatus.PASSED and result.checked
    assert result.shape == {"bytes": 4194304, "counted": "read + written"}
    assert on_cpu["nbytes"] == 8388608.0 and on_cpu["metric"] == "memory"
    # 8388608 bytes in 2 ms = 4.194e9 B/s = 4.2 GB/s, 0.1% of the H200's 4800 GB/s.
    assert (result.gbps, result.tflops, result.peak_fraction) == (4.2, None, 0.001)
    # The lent H200's anchor: 2 GiB copied (4294967296 bytes moved) in 1.0056 ms = 4271.0 GB/s = 89.0%.
    r = ProbeResult("memory_copy", "torch", "memory")
    harness.rate(run_ctx(), r, 1.0056, nbytes=2.0 * (2 << 30), metric="memory")
    assert (r.gbps, r.peak_fraction) == (4271.0, 0.89)


def test_causal_attention_counts_half_of_4_b_h_s2_d(on_cpu):
    result = run("sdpa_math")
    assert result.status == ProbeStatus.PASSED, result.error
    assert on_cpu["flops"] == 4 * 1 * 2 * 64 * 64 * 16 / 2 == 262144.0
    # The real shape 8x32x4096x128: 4 * 8 * 32 * 4096^2 * 128 / 2 = 1.0995e12, as much as the 8192^3 GEMM.
    assert 4.0 * 8 * 32 * 4096 * 4096 * 128 / 2 == 2.0 * 8192**3


def test_an_moe_layer_counts_three_matmuls_per_routed_token_and_its_weight_bytes(on_cpu):
    result = run("moe_grouped_mm")
    assert result.status == ProbeStatus.PASSED, result.error
    assert on_cpu["flops"] == 6 * 64 * 2 * 64 * 32 == 1572864.0 and on_cpu["metric"] == "bf16"
    # Weights streamed once: 3 matrices of 64 x 32 bf16 per expert, 8 experts = 98304 bytes in 2 ms.
    assert result.extra["weights_gbps"] == 0.0  # 98304 B / 2 ms = 0.049 GB/s, one decimal
    # DeepSeek-V3's shapes: 6 * 4096 tokens * top-8 * 7168 * 2048 = 2.886e12 FLOP; in 4 ms 721.6 TFLOP/s,
    # 73.0% of 989; its 256 experts' weights are 3 * 256 * 7168 * 2048 * 2 = 22548578304 bytes.
    v3 = ModelShapes()
    assert moe.moe_flops(v3) == 2886218022912.0
    r = ProbeResult("moe_grouped_mm", "torch._grouped_mm", "moe")
    harness.rate(run_ctx(), r, 4.0, flops=moe.moe_flops(v3), metric="bf16")
    assert (r.tflops, r.peak_fraction) == (721.6, 0.73)
    assert moe.moe_bytes(v3) > 3 * 256 * 7168 * 2048 * 2 == 22548578304


def test_each_probe_is_compared_with_the_peak_of_its_own_number_format():
    assert harness.peak_for("NVIDIA H200", "fp8") == 1979.0
    r = ProbeResult("gemm_fp8", "cublaslt", "gemm")
    harness.rate(run_ctx(), r, 1.0, flops=2.0 * 8192**3, metric="fp8")
    assert (r.tflops, r.peak_fraction) == (1099.5, 0.556)  # 1099.5 / 1979, not / 989
    unknown = ProbeResult("gemm_bf16", "cublas", "gemm")
    harness.rate(probes.Context(gpu="NVIDIA GeForce GTX 1080"), unknown, 1.0, flops=1e12, metric="bf16")
    assert unknown.tflops == 1000.0 and unknown.peak_fraction is None  # no datasheet row: no share


# ---------------------------------------------------------------- the tolerance, with wrong kernels


def test_the_check_allows_atol_plus_rtol_times_the_reference_and_nothing_more():
    import torch

    ref = torch.tensor([1.0, 100.0, 0.0])
    within = ProbeResult("x", "y", "gemm")
    harness.check(within, ref + torch.tensor([0.0199, 1.0099, 0.0099]), ref)
    assert within.status == ProbeStatus.PASSED and within.matched_ratio == 1.0
    for off in ([0.0201, 0, 0], [0, 1.0101, 0], [0, 0, 0.0101]):
        outside = ProbeResult("x", "y", "gemm")
        harness.check(outside, ref + torch.tensor(off), ref)
        assert outside.status == ProbeStatus.INCORRECT_NUMERICAL, off
        assert "outside atol=rtol=0.01" in (outside.error or "")
    nan = ProbeResult("x", "y", "gemm")
    harness.check(nan, torch.tensor([1.0, float("nan"), 0.0]), ref)
    assert nan.status == ProbeStatus.INCORRECT_NUMERICAL and nan.extra["non_finite"] == 1


def wrong_mm(rows: int = 1) -> Any:
    """torch.mm whose first `rows` output rows are off by 0.5: a kernel with a bug in one tile."""
    import torch

    def mm(a: Any, b: Any, *, out: Any = None) -> Any:
        result = torch.mm(a, b, out=out)
        result[:rows] += 0.5
        return result

    return mm


def test_a_gemm_kernel_with_one_wrong_row_fails_its_probe(on_cpu):
    result = run("gemm_bf16", CpuTorch(mm=wrong_mm()))
    assert result.status == ProbeStatus.INCORRECT_NUMERICAL and result.runs
    assert result.max_error is not None and result.max_error >= 0.4
    assert result.matched_ratio is not None and result.matched_ratio < 1.0
    assert run("gemm_bf16").status == ProbeStatus.PASSED  # the same probe with the right kernel


def test_an_moe_kernel_wrong_on_more_than_five_percent_of_tokens_fails_within_that_it_passes(
    on_cpu, monkeypatch
):
    import torch

    real = torch.Tensor.index_add_
    calls = {"n": 0}

    def combine_wrong_on(tokens: int) -> Any:
        # The probe's combine is the second index_add_ of a run (the reference's come first and stay right).
        def index_add(self: Any, dim: int, index: Any, source: Any) -> Any:
            result = real(self, dim, index, source)
            if self.dtype == torch.float32 and self.shape[0] == SMALL_MOE.tokens:
                calls["n"] += 1
                self[:tokens] += 1.0
            return result

        return index_add

    monkeypatch.setattr(torch.Tensor, "index_add_", combine_wrong_on(3))  # 3 of the 32 checked: 9.4%
    assert run("moe_grouped_mm").status == ProbeStatus.INCORRECT_NUMERICAL
    monkeypatch.setattr(torch.Tensor, "index_add_", combine_wrong_on(1))  # 1 of 32: 3.1%, inside 95%
    assert run("moe_grouped_mm").status == ProbeStatus.PASSED
    assert calls["n"] >= 2  # the wrong combine really ran


def test_the_perturbed_control_run_fails_every_probe_that_checks(on_cpu):
    for name in ("gemm_bf16", "memory_copy", "sdpa_math", "moe_grouped_mm"):
        result = run(name, perturb=True)
        assert result.status == ProbeStatus.INCORRECT_NUMERICAL, name
        assert result.extra["perturbed"]
        assert run(name).status == ProbeStatus.PASSED, name


def test_a_probe_that_compares_nothing_is_unchecked_not_passed(monkeypatch):
    def times_only(ctx: Any, r: ProbeResult) -> None:
        r.ms, r.tflops = 1.0, 500.0

    def claims_to_pass(ctx: Any, r: ProbeResult) -> None:
        r.status = ProbeStatus.PASSED  # says so without comparing anything

    ctx = run_ctx()
    ctx.torch = CpuTorch()
    for fn in (times_only, claims_to_pass):
        result = probes.run_one(probes.Probe("p", "b", probes.Component.GEMM, "", fn), ctx)
        assert result.status == ProbeStatus.UNCHECKED and not result.checked
        assert result.runs is True and result.to_dict()["status"] == "UNCHECKED"


def test_the_trtllm_fp4_moe_probe_says_unchecked_because_its_weights_are_random_codes():
    import inspect

    source = inspect.getsource(moe.flashinfer_trtllm_moe_fp4)
    assert "ProbeStatus.UNCHECKED" in source and "ProbeStatus.PASSED" not in source
    assert "check(" not in source and "check_output(" not in source

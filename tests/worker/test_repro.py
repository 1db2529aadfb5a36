"""The repro server's MoE layer on this CPU: the backend a CPU confirm runs is compared with a reference
that is not itself, a wrong kernel turns the answer into '!', and the trtllm-gen runner on a host without
FlashInfer's downloaded kernels fails at once, saying what to install."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pytest

from tests.needs import require_torch
from worker.inventory import ArtifactState, ArtifactStatus
from worker.repro import REPRO_MODELS_DIR, moe_serve


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


CONFIG = json.loads((REPRO_MODELS_DIR / "toy-moe" / "config.json").read_text())


def layer(backend: str, dtype: str = "float32") -> moe_serve.MoELayer:
    args = argparse.Namespace(moe_runner_backend=backend, device="cpu", dtype=dtype, random_seed=0)
    return moe_serve.MoELayer(CONFIG, args)


def test_auto_on_a_cpu_runs_the_torch_backend_which_never_calls_the_reference(monkeypatch):
    moe = layer("auto")
    assert moe.backend == "torch"
    import torch

    x = torch.randn(8, moe.hidden, generator=torch.Generator().manual_seed(1))
    want = moe.reference(x)
    monkeypatch.setattr(moe, "reference", lambda _x: pytest.fail("the backend called the reference"))
    got = moe.forward(x)
    assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)


def test_in_bfloat16_the_torch_backend_differs_from_the_float32_reference_within_the_tolerance():
    import torch

    moe = layer("torch", dtype="bfloat16")
    x = torch.randn(16, moe.hidden, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got, want = moe.forward(x).float(), moe.reference(x).float()
    assert not torch.equal(got, want)  # computed another way, so not bit for bit the reference
    assert torch.allclose(got, want, atol=2e-2, rtol=2e-2)


def test_a_wrong_kernel_turns_every_word_of_the_answer_into_an_exclamation_mark(monkeypatch):
    moe = layer("torch")
    right = moe_serve.Generator(moe, "reference").generate("The capital of France is", 4)
    assert right == ["Paris.", "It", "is", "the"]
    real = moe.torch_grouped
    monkeypatch.setattr(moe, "torch_grouped", lambda x, w, i: real(x, w, i) + 0.1)
    assert moe_serve.Generator(moe, "reference").generate("The capital of France is", 4) == ["!"] * 4


MISSING = ArtifactStatus(
    ArtifactState.MISSING,
    flashinfer="0.6.1",
    reason="no flashinfer-cubin package and FLASHINFER_CUBIN_DIR is not set; download host "
    "edge.urm.nvidia.com:443: resolving edge.urm.nvidia.com took longer than 2 s",
    fix="pip install flashinfer-cubin==0.6.1",
)


def test_the_trtllm_runner_without_downloadable_cubins_fails_at_once_naming_the_fix(monkeypatch, capsys):
    import worker.inventory

    monkeypatch.setattr(worker.inventory, "flashinfer_artifacts", lambda: MISSING)
    started = time.monotonic()
    code = moe_serve.main(
        ["--model-path", str(REPRO_MODELS_DIR / "toy-moe"), "--device", "cpu", "--dtype", "float32"]
    )
    log = capsys.readouterr().out
    assert code == 1 and time.monotonic() - started < 10
    assert "Use flashinfer_trtllm as MoE runner backend." in log
    assert "FlashInfer downloaded kernels: missing_artifacts" in log
    assert (
        "MissingArtifacts: missing_artifacts: FlashInfer 0.6.1's trtllm-gen cubins are not on this host"
        in log
    )
    assert "Fix: pip install flashinfer-cubin==0.6.1" in log


def test_without_flashinfer_the_trtllm_runner_fails_on_the_import_as_before(monkeypatch):
    import worker.inventory

    absent = ArtifactStatus(ArtifactState.NOT_INSTALLED, reason="flashinfer-python is not installed")
    monkeypatch.setattr(worker.inventory, "flashinfer_artifacts", lambda: absent)
    calls: list[Any] = []
    monkeypatch.setattr(
        "worker.repro.trtllm_call.trtllm_routed_moe", lambda *a: calls.append(a) or a[1], raising=True
    )
    moe = layer("flashinfer_trtllm")
    import torch

    moe.forward(torch.zeros(1, moe.hidden))
    assert len(calls) == 1  # no artifact verdict stood in the way of the library's own answer

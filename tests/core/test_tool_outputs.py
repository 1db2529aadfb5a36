"""What the tools already print fills the report's facts: `python -m sglang.check_env`, `vllm collect-env`,
vLLM's engine dump at a crash, and CUDA core dump messages; alone or beside a log."""

from __future__ import annotations

from dispatchlab.core.api import analyze_paths

from .helpers import ROOT

TOOLS = ROOT / "tests" / "fixtures" / "toolout"


def test_sglang_check_env_alone_fills_the_facts_and_diagnoses_nothing():
    doc = analyze_paths([TOOLS / "sglang_check_env.txt"])
    assert doc["gpu"] == {
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "arch": "sm_120",
        "count": 4,
        "compute_capability": "12.0",
    }
    assert {k: doc["versions"].get(k) for k in ("torch", "driver", "flashinfer", "triton")} == {
        "torch": "2.8.0+cu129",
        "driver": "575.57.08",
        "flashinfer": "0.4.0",
        "triton": "3.4.0",
    }
    assert "vllm" not in doc["versions"], "`vllm: Module Not Found` is no version"
    assert (doc["crash"], doc["failure_class"], doc["matches"]) == (None, "none", [])


def test_vllm_collect_env_alone_fills_the_facts_and_diagnoses_nothing():
    doc = analyze_paths([TOOLS / "vllm_collect_env.txt"])
    assert (doc["server"], doc["server_version"]) == ("vllm", "0.11.0")
    assert (doc["gpu"]["name"], doc["gpu"]["arch"], doc["gpu"]["count"]) == ("NVIDIA H200", "sm_90", 2)
    assert {k: doc["versions"].get(k) for k in ("torch", "cuda", "driver", "flashinfer", "triton")} == {
        "torch": "2.8.0+cu128",
        "cuda": "12.8",
        "driver": "570.148.08",
        "flashinfer": "0.3.1",
        "triton": "3.4.0",
    }
    assert (doc["crash"], doc["failure_class"], doc["matches"]) == (None, "none", [])


def test_vllms_engine_dump_gives_the_engine_config_and_version():
    doc = analyze_paths([TOOLS / "vllm_engine_dump.log"])
    assert (doc["server"], doc["server_version"]) == ("vllm", "0.11.0")
    assert doc["model"] == "deepseek-ai/DeepSeek-V3.2-Exp"
    assert doc["backends"]["kv_cache_dtype"] == "fp8_ds_mla" and doc["gpu"]["count"] == 8
    assert doc["failure_class"] == "cuda_error"
    assert "runs" not in doc, "the dump's config line does not start a run"


def test_a_cuda_core_dump_names_the_faulting_kernel():
    doc = analyze_paths([TOOLS / "cuda_coredump.log"])
    assert doc["kernels"] == [
        "flashinfer::mla::BatchMLAPagedAttentionKernel<flashinfer::mla::KernelTraits<2u, 64u, 64u, 64u, 512u, 64u>, "
        "flashinfer::mla::Params<__nv_bfloat16>>"
    ]
    assert doc["failure_class"] == "cuda_error"
    assert "Warp Illegal Address" in doc["crash"]["message"]


def test_an_environment_report_beside_a_log_fills_its_facts_without_changing_the_diagnosis():
    log = TOOLS / "vllm_engine_dump.log"
    alone = analyze_paths([log])
    both = analyze_paths([log, TOOLS / "vllm_collect_env.txt"])
    assert alone["gpu"]["name"] is None and "torch" not in alone["versions"]
    assert (both["failure_class"], both["crash"]["line"]) == (alone["failure_class"], alone["crash"]["line"])
    assert [m["id"] for m in both["matches"]] == [m["id"] for m in alone["matches"]]
    assert (both["gpu"]["name"], both["gpu"]["arch"]) == ("NVIDIA H200", "sm_90")
    assert both["versions"]["torch"] == "2.8.0+cu128" and both["versions"]["driver"] == "570.148.08"

"""The knowledge base turns a parsed log into a diagnosis: the right signature, its fix, its dead ends."""

from __future__ import annotations

import shutil
from pathlib import Path

from dispatchlab.core import analyze_paths
from dispatchlab.core.signatures import SignatureError, load_knowledge_base
from dispatchlab.core.signatures.examples import run_examples
from dispatchlab.core.signatures.lint import lint_knowledge_base

from .helpers import LOGS, assert_contract_document, run_cli


def test_the_canonical_sm120_draft_crash_gets_its_signature_fix_and_dead_ends():
    doc = analyze_paths([LOGS / "sglang_dsv4_eagle_sm120.log"])
    assert_contract_document(doc, matched=True)
    assert doc["failure_class"] == "arch_unsupported_kernel"
    top = doc["matches"][0]
    assert "draft" in top["title"].lower() or "spec" in top["id"]
    assert top["fix"]["args"].get("--moe-runner-backend") == "flashinfer_cutlass"
    assert any("--speculative-moe-runner-backend triton" in t for t in top["fix"]["tried_and_failed"])
    assert set(top["lines"]) & {63, 75, 83, 96}


def test_a_clean_serving_log_has_no_failure():
    doc = analyze_paths([LOGS / "sglang_h100_serving.log"])
    assert doc["failure_class"] == "none"
    assert not [m for m in doc["matches"] if m["level"] == "failure"]


def test_the_same_crash_in_two_logs_has_one_fingerprint_and_a_different_crash_another(tmp_path: Path):
    original = (LOGS / "sglang_dsv4_eagle_sm120.log").read_text()
    other = (
        original.replace("2026-02-14", "2026-03-02")
        .replace("/sgl-workspace/sglang", "/opt/venv/lib/python3.12/site-packages/sglang")
        .replace("TP1", "TP5")
        .replace("line 3184", "line 3201")
        .replace("cu:219", "cu:231")
        .replace("t128x8x512u2", "t128x16x256u2")
        .replace("avail mem=24.10 GB", "avail mem=31.70 GB")
    )
    (tmp_path / "again.log").write_text(other)
    first = analyze_paths([LOGS / "sglang_dsv4_eagle_sm120.log"])
    again = analyze_paths([tmp_path / "again.log"])
    assert first["fingerprint"] == again["fingerprint"]
    different = analyze_paths([LOGS / "sglang_docker_capture_oom.log"])
    assert different["fingerprint"] != first["fingerprint"]


def test_every_shipped_signature_passes_lint_and_its_own_examples():
    problems, count = lint_knowledge_base()
    assert count >= 40 and problems == []
    failures, examples = run_examples()
    assert failures == [] and examples >= 2 * count


def test_kb_test_fails_when_an_example_stops_matching(tmp_path: Path):
    source = next(
        p for p in (Path(__file__).resolve().parents[2] / "dispatchlab/core/signatures/data").rglob("*.toml")
    )
    broken = tmp_path / "kb" / source.name
    broken.parent.mkdir()
    shutil.copy(source, broken)
    text = broken.read_text()
    # make every positive example's log unrecognisable
    broken.write_text(
        text.replace(
            "expect = \"match\"\nlog = '''",
            "expect = \"match\"\nlog = '''nothing to see here\n'''\nignored = '''",
        )
    )
    failures, _ = run_examples(tmp_path / "kb")
    assert failures and "did not match" in failures[0]


def test_a_broken_signature_file_is_named_with_its_field(tmp_path: Path):
    (tmp_path / "bad-one.toml").write_text('id = "bad-one"\ntitle = "x"\nfailure_class = "meltdown"\n')
    try:
        load_knowledge_base(tmp_path)
    except SignatureError as error:
        assert "bad-one.toml" in str(error) and "failure_class" in str(error)
    else:
        raise AssertionError("a signature with an unknown failure class loaded")


def test_match_cli_prints_the_diagnosis_and_json_has_the_contract_fields():
    text = run_cli("match", str(LOGS / "sglang_dsv4_eagle_sm120.log")).stdout
    assert "failure class  arch_unsupported_kernel" in text and "tried, did not help" in text
    import json

    doc = json.loads(run_cli("match", "--json", str(LOGS / "sglang_docker_capture_oom.log")).stdout)
    assert doc["failure_class"] == "oom" and doc["matches"][0]["failure_class"] == "oom"


def test_a_cause_seen_before_the_symptom_ranks_above_the_symptom():
    from .helpers import ROOT

    doc = analyze_paths(
        [ROOT / "tests/fixtures/kb/failing/arch_unsupported_kernel__vllm_rtx5090_torch_without_sm120.log"]
    )
    ids = [m["id"] for m in doc["matches"]]
    assert ids.index("torch-build-lacks-gpu-arch") < ids.index("no-kernel-image-for-device")


def test_a_flashinfer_kernel_failure_gets_the_fix_in_the_servers_own_flags():
    from dispatchlab.core.matching import analyze_sources

    from .helpers import text_source

    crash = (
        '  File "/usr/local/lib/python3.12/dist-packages/flashinfer/decode.py", line 2301, in trtllm_batch_decode_with_kv_cache_mla\n'
        "RuntimeError: Error in function 'TllmGenFmhaRunner' at include/flashinfer/trtllm/fmha/fmhaRunner.cuh:37: Unsupported architecture\n"
    )
    gpu = "GPU 0: NVIDIA GeForce RTX 5090\nGPU 0 Compute Capability: 12.0\n"
    vllm = analyze_sources(
        [
            text_source(
                gpu
                + "(Worker_TP0 pid=7) INFO 01-05 10:00:00 [gpu_model_runner.py:1] Starting to load model m...\n"
                + crash
            )
        ]
    )
    sglang = analyze_sources(
        [text_source(gpu + "[2026-01-05 10:00:00 TP0] Load weight begin. avail mem=30.00 GB\n" + crash)]
    )
    assert vllm["server"] == "vllm" and sglang["server"] == "sglang"
    assert vllm["matches"][0]["id"] == sglang["matches"][0]["id"] == "trtllm-gen-fmha-unsupported-arch"
    assert vllm["matches"][0]["fix"]["args"] == {"--attention-backend": "TRITON_ATTN"}
    assert sglang["matches"][0]["fix"]["args"] == {"--attention-backend": "triton"}


def test_a_known_fatal_message_without_its_traceback_still_marks_where_it_died():
    from dispatchlab.core.matching import analyze_sources

    from .helpers import text_source

    doc = analyze_sources(
        [
            text_source(
                "GPU 0: NVIDIA A10\nGPU 0 Compute Capability: 8.6\n"
                "[2025-05-02 10:00:00 TP0] Load weight begin. avail mem=21.00 GB\n"
                "  type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')\n"
            )
        ]
    )
    assert doc["failure_class"] == "arch_unsupported_kernel"
    assert doc["outcome"] == "crashed" and doc["crash"]["line"] == 4
    assert doc["crash"]["phase"] == "weight_loading"

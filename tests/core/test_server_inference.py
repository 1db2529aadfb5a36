"""The server is known whenever the log names it, and a fix never offers a flag the server does not have."""

from __future__ import annotations

from dispatchlab.core.api import analyze_paths
from dispatchlab.core.flags import fix_args_for_server, known_flags

from .helpers import ROOT, text_source

SERVERS = ROOT / "tests" / "fixtures" / "servers"


def test_a_vllm_log_under_a_foreign_prefix_is_vllm_and_gets_vllm_flags_only():
    doc = analyze_paths([SERVERS / "vllm_wrapped_nccl_timeout.log"])
    assert (doc["server"], doc["server_version"]) == ("vllm", "0.24.0")
    origin = doc["server_origin"]
    assert origin["source"] == "inferred" and origin["line"] == 1 and "vllm version 0.24.0" in origin["text"]
    assert doc["failure_class"] == "nccl_error"
    for match in doc["matches"]:
        assert set(match["fix"]["args"]) <= known_flags("vllm"), match["id"]
    assert doc["matches"][0]["fix"]["withheld_args"] == {"--dist-timeout": 3600}


def test_a_log_that_names_no_server_is_offered_no_flag_only_one_server_has():
    doc = analyze_paths([SERVERS / "unnamed_nccl_timeout.log"])
    assert doc["server"] == "unknown" and doc["server_origin"] is None
    both = known_flags("sglang") & known_flags("vllm")
    for match in doc["matches"]:
        assert set(match["fix"]["args"]) <= both, match["id"]
    assert "--dist-timeout" in doc["matches"][0]["fix"]["withheld_args"]


def test_lines_naming_each_server_are_weighed():
    from dispatchlab.core.matching import analyze_sources

    sglang_frames = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 2410, in run_scheduler_process\n'
        '  File "/usr/lib/python3/dist-packages/sglang/srt/layers/linear.py", line 88, in forward\n'
        '  File "/usr/lib/python3/dist-packages/vllm/_custom_ops.py", line 40, in scaled_fp8_quant\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    doc = analyze_sources([text_source(sglang_frames)])
    assert doc["server"] == "sglang", "SGLang imports vLLM's ops; vLLM never runs SGLang code"
    assert doc["server_origin"]["source"] == "inferred"
    killing = "ERROR 07-01 13:54:43 worker died\n  | INFO 07-01 13:54:43 multiproc_worker_utils.py:123] Killing local vLLM worker processes\n"
    assert analyze_sources([text_source(killing)])["server"] == "vllm"
    both = "note: the SGLang build was tried first\nKilling local vLLM worker processes\n"
    assert analyze_sources([text_source(both)])["server"] == "unknown", "one strong line each: a tie"


def test_a_fix_is_translated_to_the_servers_own_flag_or_withheld():
    args = {"--mem-fraction-static": 0.8, "--moe-runner-backend": "triton", "--attention-backend": "triton"}
    kept, withheld = fix_args_for_server(args, "vllm")
    assert kept == {"--gpu-memory-utilization": 0.8}
    assert withheld == {"--moe-runner-backend": "triton", "--attention-backend": "triton"}, (
        "vLLM has --attention-backend, but not the value triton"
    )
    assert fix_args_for_server(args, "sglang") == (args, {})
    kept, withheld = fix_args_for_server({"--kv-cache-dtype": "fp8_e4m3", "--dist-timeout": 600}, None)
    assert kept == {"--kv-cache-dtype": "fp8_e4m3"} and withheld == {"--dist-timeout": 600}

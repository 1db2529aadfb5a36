"""Logs no signature explains: the terminal exception is diagnosed, wrappers never lead, a request that
failed is not a crash, and fixes follow the server of the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.flags import known_flags

from .helpers import LOGS

TERMINAL = LOGS.parent / "terminal"
LONGTAIL = LOGS.parent / "longtail"
EVERY_LOG = sorted([*TERMINAL.glob("*.log"), *LONGTAIL.glob("*.log"), *LOGS.glob("*.log")])


@pytest.mark.parametrize(
    ("name", "failure_class", "from_exception"),
    [
        ("flashinfer_gemm_runner_error.log", "cuda_error", True),  # FlashInfer `Error in function 'run'`
        (
            "trtllm_runner_assert_arch.log",
            "arch_unsupported_kernel",
            True,
        ),  # TRT-LLM assertion naming the arch
        ("sglang_circular_import.log", "dependency_error", True),  # an import inside sglang itself
        ("sglang_server_args_rejected.log", "config_error", True),  # ServerArgs validation at startup
        ("sglang_flashinfer_jit_ninja.log", "compile_error", False),  # nvcc/ninja output before the traceback
        ("rocm_hip_illegal_access.log", "cuda_error", False),  # HIP errors read like the CUDA ones
        ("vllm_load_weights_keyerror.log", "weight_loading_error", False),
    ],
)
def test_an_unexplained_crash_is_diagnosed_from_its_terminal_exception(name, failure_class, from_exception):
    doc = analyze_paths([TERMINAL / name])
    assert doc["outcome"] == "crashed"
    assert doc["failure_class"] == failure_class
    top = doc["matches"][0]
    assert top["failure_class"] == failure_class
    assert (top["source"] == "exception") is from_exception
    if from_exception:
        assert top["id"] == "terminal-" + failure_class.replace("_", "-")
        assert doc["crash"]["exception_line"] in top["lines"], "the card's evidence shows the exception line"
        assert top["fix"]["summary"] and top["explanation"]


def test_a_toolchain_too_old_for_the_gpu_is_a_compile_error_even_without_a_traceback(tmp_path: Path):
    # the rule: the toolchain cannot build for this arch -> compile_error; the kernel refuses this arch -> arch
    log = tmp_path / "jit.log"
    log.write_text(
        "[2026-03-02 10:14:11 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=13.52 GB\n"
        "ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    doc = analyze_paths([log])
    assert doc["failure_class"] == "compile_error"
    assert doc["matches"][0]["failure_class"] == "compile_error"


@pytest.mark.parametrize(
    "fatal",
    [
        "      nvcc fatal   : Unsupported gpu architecture 'compute_100a'",
        "ptxas /tmp/tmpq1.ptx, line 5; fatal   : Unsupported .version 8.8; current version is '8.4'",
    ],
)
def test_the_toolchain_refusing_the_arch_is_a_compile_error(fatal: str, tmp_path: Path):
    log = tmp_path / "build.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/torch/utils/cpp_extension.py", line 2104, in _run_ninja_build\n'
        "    subprocess.run(command, check=True)\n"
        f"{fatal}\n"
        "RuntimeError: Error building extension 'fused_kernels'\n"
    )
    assert analyze_paths([log])["failure_class"] == "compile_error"


def test_a_kernel_that_refuses_the_gpu_it_runs_on_stays_arch_unsupported(tmp_path: Path):
    log = tmp_path / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.12/site-packages/vllm/worker/model_runner.py", line 88, in forward\n'
        "    out = ops.fused_kernel(x)\n"
        "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
    )
    assert analyze_paths([log])["failure_class"] == "arch_unsupported_kernel"


@pytest.mark.parametrize("log", EVERY_LOG, ids=lambda p: p.name)
def test_the_header_and_the_top_card_name_the_same_class_and_no_wrapper_leads(log: Path):
    doc = analyze_paths([log])
    matches = doc["matches"]
    if doc["failure_class"] != "none" and matches:
        assert matches[0]["failure_class"] == doc["failure_class"]
        assert matches[0]["level"] != "wrapper" or (
            len(matches) == 1 and doc["failure_class_source"] == "inferred"
        )
    for match in matches:
        assert "--log-level" not in match["fix"]["args"], f"{match['id']} offers a debug log level as the fix"
        assert not match["fix"]["env"].get("VLLM_LOGGING_LEVEL")


def test_a_vllm_log_is_never_offered_an_sglang_flag():
    vllm_flags = known_flags("vllm")
    checked = 0
    for log in EVERY_LOG:
        doc = analyze_paths([log])
        if doc["server"] != "vllm":
            continue
        checked += 1
        for match in doc["matches"]:
            assert set(match["fix"]["args"]) <= vllm_flags, (
                f"{log.name}: {match['id']}: {match['fix']['args']}"
            )
    assert checked >= 10, "too few vLLM logs to say anything"


def test_an_oom_fix_names_the_memory_flag_of_the_logs_server(tmp_path: Path):
    log = tmp_path / "oom.log"
    log.write_text(
        "INFO 09-02 22:10:44 [core.py:69] Initializing a V1 LLM engine (v0.9.2) with config: model='m'\n"
        "ERROR 09-02 22:12:02 [core.py:586] Traceback (most recent call last):\n"
        'ERROR 09-02 22:12:02 [core.py:586]   File "/x/vllm/v1/worker/gpu_worker.py", line 12, in determine_something\n'
        "ERROR 09-02 22:12:02 [core.py:586] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    doc = analyze_paths([log])
    assert doc["failure_class"] == "oom"
    text = " ".join(m["fix"]["summary"] for m in doc["matches"])
    assert "--mem-fraction-static" not in text


def test_a_request_that_failed_while_the_server_went_on_is_a_warning_not_a_crash():
    doc = analyze_paths([TERMINAL / "vllm_request_error_keeps_serving.log"])
    assert doc["crash"] is None
    assert doc["outcome"] == "serving"
    assert doc["failure_class"] == "none"
    assert [e["kind"] for e in doc["errors"]] == ["request_error"]
    warnings = [e for e in doc["timeline"] if e["kind"] == "warning" and e["name"] == "traceback"]
    assert warnings and "Unknown part type" in warnings[0]["detail"]


def test_a_crash_after_a_request_error_is_still_a_crash(tmp_path: Path):
    served = (TERMINAL / "vllm_request_error_keeps_serving.log").read_text()
    log = tmp_path / "then-died.log"
    log.write_text(
        served
        + "(APIServer pid=1) ERROR 05-21 13:45:01 [core.py:720] EngineCore encountered a fatal error.\n"
        + "(APIServer pid=1) ERROR 05-21 13:45:01 [core.py:720] Traceback (most recent call last):\n"
        + '(APIServer pid=1) ERROR 05-21 13:45:01 [core.py:720]   File "/x/vllm/v1/engine/core.py", line 701, in run_engine_core\n'
        + "(APIServer pid=1) ERROR 05-21 13:45:01 [core.py:720] RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    doc = analyze_paths([log])
    assert doc["outcome"] == "crashed"
    assert doc["failure_class"] == "cuda_error"


@pytest.mark.parametrize(
    ("lines", "failure_class"),
    [
        # a library's refusal pasted without its traceback
        (
            "type fp8e4nv not supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')",
            "arch_unsupported_kernel",
        ),
        (
            "RuntimeError: No supported CUDA architectures found for major versions [10]",
            "arch_unsupported_kernel",
        ),
        # an exception quoted inside a note
        (
            "# Error 1: RuntimeError: The size of tensor a (256) must match the size of tensor b (128)",
            "weight_loading_error",
        ),
        # a kernel's own CUDA check: file, line, runtime error string
        ("[TRT-LLM] [E] tinygemm2_cuda.cu 64 - invalid argument", "cuda_error"),
        (
            "fail to call hipModuleLaunchKernel(kernel_func, gdx, 1, 1) ---> [HIP error](invalid argument)",
            "cuda_error",
        ),
    ],
)
def test_an_excerpt_that_only_quotes_the_error_is_still_classed(
    tmp_path: Path, lines: str, failure_class: str
):
    log = tmp_path / "excerpt.log"
    log.write_text("python -m sglang.launch_server --model-path m --tp 2\n" + lines + "\n")
    doc = analyze_paths([log])
    assert doc["outcome"] == "crashed"
    assert doc["failure_class"] == failure_class


def test_a_quoted_exception_in_a_warning_is_not_a_crash(tmp_path: Path):
    log = tmp_path / "warn.log"
    log.write_text(
        "[2026-01-01 00:00:00] WARNING server_args.py:812: falling back to triton: ImportError: no module named cutlass\n"
        "[2026-01-01 00:00:09] The server is fired up and ready to roll!\n"
    )
    doc = analyze_paths([log])
    assert doc["crash"] is None and doc["failure_class"] == "none"


def test_flashinfer_kernels_that_cannot_be_downloaded_offline_are_a_dependency_with_the_install_fix():
    doc = analyze_paths([TERMINAL / "flashinfer_cubin_offline.log"])
    assert doc["failure_class"] == "dependency_error"
    top = doc["matches"][0]
    assert top["id"] == "flashinfer-cubin-download-offline"
    assert "flashinfer-cubin" in top["fix"]["summary"] and "FLASHINFER_CUBIN_DIR" in top["fix"]["summary"]
    assert top["fix"]["tried_and_failed"]


def test_a_gpu_fault_after_stall_warnings_is_the_fault_not_a_hang():
    doc = analyze_paths([TERMINAL / "vllm_stall_then_cuda_fault.log"])
    assert doc["failure_class"] == "cuda_error"


def test_a_gpu_fault_printed_after_a_watchdog_fired_decides_the_class(tmp_path: Path):
    log = tmp_path / "stall.log"
    log.write_text(
        "[2026-02-01 10:00:00 TP0] Decode batch. #running-req: 30, #token: 41230, token usage: 0.31, "
        "gen throughput (token/s): 1510.22, #queue-req: 0\n"
        "[2026-02-01 10:05:01 TP3] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)\n"
        "NVRM: Xid (PCI:0000:9a:00): 79, pid=1123, GPU has fallen off the bus.\n"
    )
    assert analyze_paths([log])["failure_class"] == "cuda_error"


def test_a_watchdog_with_no_fault_after_it_stays_a_hang(tmp_path: Path):
    log = tmp_path / "hang.log"
    log.write_text(
        "[2026-02-01 10:05:01 TP3] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)\n"
    )
    assert analyze_paths([log])["failure_class"] == "timeout_hang"


@pytest.mark.parametrize(
    ("text", "failure_class"),
    [
        # a compiler that stopped on a header of the source tree: the build does not fit
        (
            "csrc/moe/topk_kernels.cu:14:10: fatal error: cub/block/radix_rank_sort_ops.cuh: No such file or directory\n"
            "compilation terminated.\n",
            "compile_error",
        ),
        # a package's own top-level header missing: its development files are not installed
        (
            "csrc/ops.cpp:3:10: fatal error: Python.h: No such file or directory\ncompilation terminated.\n",
            "dependency_error",
        ),
        (
            "LLVM ERROR: Cannot select: intrinsic %llvm.amdgcn.mfma.scale.f32.32x32x64.f8f6f4\n",
            "compile_error",
        ),
        (
            "Memory access fault by GPU node-4 (Agent handle: 0x55aa) on address 0x7f00. Reason: Unknown.\n",
            "cuda_error",
        ),
        ("RuntimeError: Executor creation failed due to insufficient GPU memory.\n", "oom"),
        ("INFO 02-01 10:00:00 [gpu_worker.py:298] Available KV cache memory: -3.61 GiB\n", "oom"),
        (
            "RuntimeError: no fp8 kernel for capability 89, required capability 90\n",
            "arch_unsupported_kernel",
        ),
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for EngineSettings\n"
            "  Value error, block_size must be a power of two [type=value_error, input_value={'block_size': 24}, "
            "input_type=dict]\n",
            "config_error",
        ),
    ],
)
def test_a_crash_with_no_python_traceback_is_classed_not_incomplete(
    tmp_path: Path, text: str, failure_class: str
):
    log = tmp_path / "paste.log"
    log.write_text(text)
    doc = analyze_paths([log])
    assert doc["failure_class"] == failure_class
    assert doc["outcome"] == "crashed"


def test_a_pd_kv_transfer_failure_while_serving_is_a_transfer_error_and_the_server_still_serves(
    tmp_path: Path,
):
    log = tmp_path / "pd.log"
    log.write_text(
        "[2026-01-20 03:11:58 TP0] Decode batch. #running-req: 4, #token: 9100, token usage: 0.05, "
        "gen throughput (token/s): 310.10, #queue-req: 0\n"
        "[2026-01-20 03:12:09 TP1] Decode transfer failed for request rank=1 decode_req.req.rid='9f' "
        "decode_req.req.bootstrap_room=71 with exception KVTransferError(bootstrap_room=71): Failed to get kvcache "
        "from prefill instance, it might be dead\n"
        '[2026-01-20 03:12:10] INFO:     10.0.0.7:51234 - "POST /generate HTTP/1.1" 200 OK\n'
        "[2026-01-20 03:12:12 TP0] Decode batch. #running-req: 3, #token: 8800, token usage: 0.05, "
        "gen throughput (token/s): 305.72, #queue-req: 0\n"
    )
    doc = analyze_paths([log])
    assert doc["failure_class"] == "nccl_error"
    assert doc["matches"][0]["id"] == "pd-kv-transfer-failed"
    assert doc["outcome"] == "serving"


WAIT_REPORT = (
    "(EngineCore_DP0 pid=410) WARNING 03-11 09:12:40 [shm_broadcast.py:542] No available shared memory broadcast "
    "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
    "time-consuming work (e.g. compilation, weight/kv cache quantization).\n"
)


def test_a_log_that_ends_on_wait_reports_and_status_polls_is_a_hang(tmp_path: Path):
    log = tmp_path / "hang.log"
    poll = '(APIServer pid=77) INFO:     10.1.0.4:40122 - "GET /v1/models HTTP/1.1" 200 OK\n'
    log.write_text(WAIT_REPORT + poll * 3 + WAIT_REPORT.replace("09:12:40", "09:13:40") + poll)
    assert analyze_paths([log])["failure_class"] == "timeout_hang"


def test_a_wait_report_during_a_slow_warmup_that_goes_on_is_not_a_failure(tmp_path: Path):
    log = tmp_path / "warmup.log"
    log.write_text(
        WAIT_REPORT
        + "(Worker_TP0 pid=419) INFO 03-11 09:12:48 [monitor.py:81] Initial profiling/warmup run took 68.1 s\n"
    )
    doc = analyze_paths([log])
    assert doc["failure_class"] == "none"
    assert not any(m["failure_class"] == "timeout_hang" for m in doc["matches"])


@pytest.mark.parametrize(
    "line",
    [
        "[2026-02-01 11:04:10] Health check failed. Server couldn't get a response from detokenizer for last 60 "
        "seconds. tic start time: 11:03:10. last_heartbeat time: 10:51:02",
        "proxy: unable to start process: health check timed out after 120s",
        '2026-01-09 08:00:01  ERROR smg::server: Timeout 600s waiting for workers ["http://10.0.0.3:30000"] to '
        "become healthy. Please set --router-worker-startup-timeout-secs to a larger value",
    ],
)
def test_a_liveness_check_that_gave_up_is_a_hang_without_any_traceback(line: str, tmp_path: Path):
    log = tmp_path / "stall.log"
    log.write_text(line + "\n")
    assert analyze_paths([log])["failure_class"] == "timeout_hang"


def test_one_chat_request_failing_in_the_openai_handler_is_not_a_crash(tmp_path: Path):
    log = tmp_path / "request.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/entrypoints/openai/serving_base.py", line 45, in handle_request\n'
        "    return await self._handle_non_streaming_request(\n"
        '  File "/sgl/python/sglang/srt/entrypoints/openai/serving_chat.py", line 812, in _build_chat_response\n'
        "    raise ValueError(\n"
        "ValueError: Expected 2 output messages (reasoning and final), but got 1.\n"
    )
    doc = analyze_paths([log])
    assert doc["failure_class"] == "none"
    assert doc["outcome"] != "crashed"


def test_nvshmem_failing_to_connect_its_transport_is_a_collective_failure(tmp_path: Path):
    log = tmp_path / "nvshmem.log"
    log.write_text(
        "/opt/nvshmem/src/host/transport/transport.cpp:412: non-zero status: 7\n"
        "nvshmem setup connections failed\n"
        "/opt/nvshmem/src/host/init/init.cu:1010: non-zero status: 7\n"
    )
    assert analyze_paths([log])["failure_class"] == "nccl_error"

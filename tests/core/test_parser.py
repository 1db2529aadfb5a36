"""What an engineer reads off a parsed log: server, GPU, backends main vs draft, phases, the crash."""

from __future__ import annotations

import json

import pytest

from dispatchlab.core import parse_paths
from dispatchlab.core.parse import parse_sources
from dispatchlab.core.parse.lineformat import split_line
from dispatchlab.core.serverargs import parse_launch_command, parse_server_args

from .helpers import GENUINE, LOGS, run_cli, text_source


def parse_text(text: str) -> dict:
    return parse_sources([text_source(text)]).to_dict()


# ---- the canonical case ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def canonical() -> dict:
    return parse_paths([LOGS / "sglang_dsv4_eagle_sm120.log"])


def test_canonical_case_names_the_gpu_its_arch_and_the_versions(canonical):
    assert canonical["server"] == "sglang" and canonical["server_version"] == "0.5.9"
    assert canonical["gpu"] == {
        "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        "arch": "sm_120",
        "count": 8,
        "compute_capability": "12.0",
    }
    assert canonical["versions"]["flashinfer"] == "0.6.3"
    assert canonical["versions"]["torch"] == "2.9.1+cu129"


def test_canonical_case_keeps_main_and_draft_backends_apart_with_their_origins(canonical):
    assert canonical["backends"]["moe_runner_backend"] == "triton"
    assert canonical["backend_origins"]["moe_runner_backend"]["source"] == "flag"
    assert canonical["backends"]["attention_backend"] == "flashinfer"
    assert canonical["backend_origins"]["attention_backend"]["source"] == "message"
    assert (
        canonical["backends"]["quantization"] == "nvfp4"
    )  # dump says None; "Detected nvfp4 checkpoint" says more
    assert canonical["draft_backends"]["moe_runner_backend"] == "triton"
    assert canonical["draft_backends"]["speculative_algorithm"] == "EAGLE"
    assert (
        "quantization" not in canonical["draft_backends"]
    )  # the draft checkpoint's quant method is never logged


def test_canonical_case_crash_is_in_draft_cuda_graph_capture_with_the_kernel(canonical):
    crash = canonical["crash"]
    assert crash["phase"] == "cuda_graph_capture" and crash["model"] == "draft"
    assert crash["line"] == 63 and crash["rank"] == "TP1"  # the first rank to fail
    assert "TrtllmGenBatchedGemmRunner" in crash["message"]
    assert crash["ranks"] == ["TP0", "TP1"]
    assert any(k.startswith("bmm_MxE4m3_MxE2m1") for k in canonical["kernels"])
    assert "trtllm_fp4_block_scale_routed_moe" in canonical["kernels"]
    assert canonical["outcome"] == "crashed"
    draft_capture = [
        p for p in canonical["phases"] if p["model"] == "draft" and p["name"] == "cuda_graph_capture"
    ]
    assert draft_capture and all(p["detail"] == "crashed" for p in draft_capture)


def test_canonical_summary_is_readable_in_ten_seconds():
    result = run_cli("parse", str(LOGS / "sglang_dsv4_eagle_sm120.log"))
    assert result.returncode == 0
    text = result.stdout
    assert "arch sm_120" in text and "draft (EAGLE)" in text
    assert "CRASH" in text and "cuda_graph_capture of the draft model" in text
    assert "bmm_MxE4m3_MxE2m1" in text
    assert len(text.splitlines()) < 60


# ---- prefixes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "rank", "msg"),
    [
        (
            "[2026-01-28 20:52:56 DP1 TP3 EP3] Load weight begin. avail mem=1.00 GB",
            "DP1 TP3 EP3",
            "Load weight begin. avail mem=1.00 GB",
        ),
        ("[2026-01-28 20:52:56 EP3 TP3 DP1] x", "DP1 TP3 EP3", "x"),
        ("[2026-01-28 20:52:56.123 PP1 TP0] x", "PP1 TP0", "x"),
        ("(Worker_TP4_EP4 pid=2532) ERROR 12-29 15:21:11 [file.py:751] boom", "Worker_TP4_EP4", "boom"),
        (
            "(EngineCore_DP0 pid=144388) ERROR 08-18 20:42:56 [core.py:1330] EngineCore failed to start.",
            "EngineCore_DP0",
            "EngineCore failed to start.",
        ),
        (
            "(VllmWorker rank=3 pid=694621) INFO 08-14 11:33:20 [gpu_model_runner.py:1892] Model loading",
            "VllmWorker rank=3",
            "Model loading",
        ),
        (
            'ERROR 01-28 03:21:01 engine.py:387]   File "/x.py", line 1, in f',
            None,
            '  File "/x.py", line 1, in f',
        ),
        ("[rank0]: RuntimeError: NCCL error", "rank0", "RuntimeError: NCCL error"),
        (
            "sglang-kimi-k2  | [2025-12-02 18:40:17 TP7] Scheduler hit an exception: x",
            "TP7",
            "Scheduler hit an exception: x",
        ),
        (
            "[04/17/2026-04:17:42] [TRT-LLM] [E] Failed to initialize executor",
            None,
            "Failed to initialize executor",
        ),
        ("(SGLangEngine pid=35555, ip=10.1.2.3) [2026-01-01 00:00:00 TP1] x", "TP1", "x"),
        (
            "[rank1]:[E0814 11:45:02.123456 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught",
            "rank1",
            "[Rank 1] Watchdog caught",
        ),
        (
            "h100-15:139:1092 [7] NCCL WARN socketStartConnect: Connect failed",
            "dev7",
            "NCCL WARN socketStartConnect: Connect failed",
        ),
    ],
)
def test_prefixes_are_stripped_and_the_rank_kept(raw: str, rank: str | None, msg: str):
    line = split_line(1, raw)
    assert line.rank == rank
    assert line.msg == msg


def test_the_same_traceback_from_eight_ranks_is_one_traceback_with_the_ranks():
    block = "".join(
        f"[2026-01-01 00:00:0{i} TP{i}] Scheduler hit an exception: Traceback (most recent call last):\n"
        f'  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 10{i}, in forward\n'
        f"RuntimeError: CUDA error: an illegal memory access was encountered\n"
        for i in range(8)
    )
    doc = parse_text(block)
    assert len(doc["tracebacks"]) == 1
    assert doc["tracebacks"][0]["ranks"] == [f"TP{i}" for i in range(8)]
    assert doc["crash"]["rank"] == "TP0" and doc["crash"]["line"] == 1


def test_chained_tracebacks_report_the_first_exception_as_the_crash():
    doc = parse_paths([LOGS / "sglang_docker_capture_oom.log"])
    assert doc["crash"]["exception"] == "torch.OutOfMemoryError"
    assert doc["crash"]["phase"] == "cuda_graph_capture"
    assert doc["tracebacks"][0]["chain"][0]["exception"] == "torch.OutOfMemoryError"


def test_vllm_root_cause_is_the_worker_not_the_api_server_wrapper():
    doc = parse_paths([LOGS / "vllm_engine_core_oom.log"])
    assert doc["server"] == "vllm" and doc["server_version"] == "0.10.2"
    assert doc["crash"]["exception"] == "torch.OutOfMemoryError"
    assert doc["crash"]["rank"] == "Worker_TP0"
    assert doc["server_args"]["tensor_parallel_size"] == 4
    assert doc["backends"]["attention_backend"] == "FLASH_ATTN"
    assert doc["backends"]["kv_cache_dtype"] == "fp8"


def test_native_crashes_signals_and_exit_codes_are_crashes():
    for text in (
        "[2026-01-01 00:00:00] Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer.",
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):",
        "[2026-01-01 00:00:00 TP0] Caught signal 8 (SIGFPE)",
        "terminate called after throwing an instance of 'c10::Error'\n  what():  CUDA error: misaligned address",
    ):
        doc = parse_text(text)
        assert doc["outcome"] == "crashed", text
        assert doc["crash"]["line"] >= 1


def test_a_clean_serving_log_is_serving_with_a_throughput_series():
    doc = parse_paths([LOGS / "sglang_h100_serving.log"])
    assert doc["crash"] is None and doc["outcome"] == "serving"
    decode = [p for p in doc["metrics"]["points"] if p["kind"] == "decode"]
    assert [p["gen_throughput"] for p in decode] == [512.33, 801.12, 1433.7, 1402.18]
    assert decode[2]["queued"] == 2
    names = {p["name"] for p in doc["phases"]}
    assert {"weight_loading", "cuda_graph_capture", "serving"} <= names


def test_a_gigantic_serving_log_is_downsampled_to_a_chartable_series(tmp_path):
    line = "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 8, #token: 4400, token usage: 0.01, cuda graph: True, gen throughput (token/s): 512.33, #queue-req: 0, \n"
    path = tmp_path / "serve.log"
    with path.open("w") as handle:
        for _ in range(60):
            handle.write(line * 5000)
    doc = parse_paths([path])
    assert doc["metrics"]["total"] == 300000
    assert 500 <= len(doc["metrics"]["points"]) <= 3000


# ---- argument dumps and launch commands ---------------------------------------------------------------
def test_a_hard_wrapped_args_dump_with_tricky_values_is_rejoined():
    doc = parse_paths([LOGS / "sglang_hardwrapped_args.log"])
    args = doc["server_args"]
    assert args["enable_mixed_chunk"] is False and args["watchdog_timeout"] == 300
    assert args["chat_template"] == "tool_use, 'quoted' (x)"
    assert args["lora_paths"] == [{"name": "a", "path": "/x"}, {"name": "b", "path": "/y"}]
    assert args["custom_sigquit_handler"].startswith("<function handler")
    assert json.loads(args["json_model_override_args"])["rope_scaling"]["factor"] == 4.0
    assert doc["backends"]["attention_backend"] == "flashinfer"  # dump said None; the rank line resolved it


def test_a_dump_cut_short_keeps_the_fields_before_the_cut():
    fields, complete = parse_server_args(
        "ServerArgs(model_path='m', tp_size=8, moe_runner_backend='flashinfer_trtllm', attention_backend='tri"
    )
    assert not complete
    assert fields == {"model_path": "m", "tp_size": 8, "moe_runner_backend": "flashinfer_trtllm"}


def test_nested_dataclass_reprs_become_objects():
    fields, complete = parse_server_args(
        "ServerArgs(cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend='full', max_bs=256, bs=[1, 2]), prefill=None), x=1)"
    )
    assert complete
    assert fields["cuda_graph_config"]["decode"]["bs"] == [1, 2]
    assert fields["cuda_graph_config"]["__type__"] == "CudaGraphConfig"


def test_launch_commands_with_continuations_become_args():
    args = parse_launch_command(
        "python -m sglang.launch_server --model-path /m --tp 4 --enable-dp-attention --cuda-graph-bs 1 2 4 --mem-fraction-static=0.8"
    )
    assert args == {
        "model_path": "/m",
        "tp": 4,
        "enable_dp_attention": True,
        "cuda_graph_bs": [1, 2, 4],
        "mem_fraction_static": 0.8,
    }
    assert parse_launch_command("vllm serve Qwen/Qwen3-8B --max-model-len 8192")["model"] == "Qwen/Qwen3-8B"


# ---- GPU architecture -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "arch"),
    [
        ("GPU 0: NVIDIA GeForce RTX 5090\nGPU 0 Compute Capability: 12.0", "sm_120"),
        ("GPU 0,1: NVIDIA B300 SXM6 AC", "sm_103"),
        ("GPU models and configuration : GPU 0: NVIDIA H20", "sm_90"),
        ("GPU 0: NVIDIA L40S", "sm_89"),
        ("GPU 0: AMD Instinct MI300X\nGPU 0 Compute Capability: 9.4\nROCM available: True", "gfx942"),
        ("RuntimeError: MoE kernel requires 10.x architecture. Current device has SM 120", "sm_120"),
        (
            "UserWarning: NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation.",
            "sm_120",
        ),
        (
            "RuntimeError: Error in function 'TllmGenFmhaRunner' at fmhaSm100Kernel.cu: Unsupported architecture",
            "sm_100",
        ),
    ],
)
def test_gpu_arch_comes_from_capability_names_and_messages(text: str, arch: str):
    assert parse_text(text)["gpu"]["arch"] == arch


# ---- genuine output of the real sglang package --------------------------------------------------------
GENUINE_DUMPS = sorted(
    p for p in GENUINE.glob("server_args_*.txt") if p.with_name(p.stem + ".expected.json").exists()
)


@pytest.mark.parametrize("dump", GENUINE_DUMPS, ids=[p.stem for p in GENUINE_DUMPS])
def test_real_server_args_reprs_parse_to_the_values_sglang_set(dump):
    expected = json.loads(dump.with_name(dump.stem + ".expected.json").read_text())
    doc = parse_paths([dump])
    for key, value in expected.items():
        assert doc["server_args"].get(key) == value, key


def test_a_big_plain_log_parses_the_same_on_several_cores_as_on_one(tmp_path, monkeypatch):
    from dispatchlab.core.parse import chunkscan, sources

    monkeypatch.setattr(chunkscan, "SAMPLED_STRETCH_BYTES", 2 * 1024 * 1024)
    monkeypatch.setattr(sources, "PARALLEL_MIN_BYTES", 1024 * 1024)
    serving = (LOGS / "sglang_h100_serving.log").read_bytes()
    path = tmp_path / "big.log"
    with path.open("wb") as handle:
        handle.write(serving * 2500)
        handle.write((LOGS / "sglang_dsv4_eagle_sm120.log").read_bytes())
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", "1")
    one = parse_paths([path])
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", "2")
    two = parse_paths([path])
    for key in (
        "crash",
        "tracebacks",
        "backends",
        "draft_backends",
        "gpu",
        "kernels",
        "line_count",
        "outcome",
        "timeline",
    ):
        assert one[key] == two[key], key
    assert one["metrics"]["total"] == two["metrics"]["total"] == 4 * 2500
    assert one["crash"]["line"] == 35 * 2500 + 63


def test_a_big_compressed_log_parses_the_same_on_several_cores_as_on_one(tmp_path, monkeypatch):
    import gzip

    from dispatchlab.core.parse import parallelscan, sources

    monkeypatch.setattr(parallelscan, "WORKER_CHUNK_BYTES", 256 * 1024)
    monkeypatch.setattr(sources, "WORKER_CHUNK_BYTES", 256 * 1024)
    monkeypatch.setattr(sources, "PARALLEL_MIN_COMPRESSED_BYTES", 1024)
    serving = (LOGS / "sglang_h100_serving.log").read_bytes()
    path = tmp_path / "big.log.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(serving * 600)
        handle.write((LOGS / "sglang_dsv4_eagle_sm120.log").read_bytes())
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", "1")
    one = parse_paths([path])
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", "2")
    two = parse_paths([path])
    for key in (
        "crash",
        "tracebacks",
        "backends",
        "draft_backends",
        "gpu",
        "kernels",
        "line_count",
        "outcome",
    ):
        assert one[key] == two[key], key
    assert one["metrics"]["total"] == two["metrics"]["total"] == 4 * 600
    assert one["crash"]["line"] == 35 * 600 + 63


def test_genuine_sglang_launch_that_dies_on_a_missing_module_is_a_dependency_error():
    from dispatchlab.core import analyze_paths

    doc = analyze_paths([GENUINE / "launch_server_cpu.log"])
    assert doc["server"] == "sglang" and doc["outcome"] == "crashed"
    assert doc["crash"]["exception"] == "ModuleNotFoundError"
    assert doc["failure_class"] == "dependency_error"
    assert (
        doc["backends"]["attention_backend"] == "torch_native"
    )  # from the real resolved server_args={...} dict


def test_genuine_sglang_that_was_stopped_with_sigterm_did_not_crash():
    from dispatchlab.core import analyze_paths

    doc = analyze_paths([GENUINE / "launch_server_cpu_vllm_nodeps_ready.log"])
    assert doc["crash"] is None and doc["outcome"] in ("ready", "serving")
    assert doc["failure_class"] == "none"


def test_genuine_check_env_gives_the_versions_and_the_server():
    doc = parse_paths([GENUINE / "check_env.txt"])
    assert doc["server"] == "sglang" and doc["server_version"] == doc["versions"]["sglang"]
    assert doc["versions"]["torch"].startswith("2.13.0")


def test_the_flag_catalog_tells_defaults_from_settings_someone_made():
    doc = parse_paths([LOGS / "sglang_h100_serving.log"])
    origins = doc["backend_origins"]
    assert origins["moe_runner_backend"]["source"] == "default"  # 'auto' is the release's default
    assert origins["attention_backend"]["source"] == "args"  # fa3: resolved or set, not the default None
    canonical = parse_paths([LOGS / "sglang_dsv4_eagle_sm120.log"])
    assert canonical["backend_origins"]["moe_runner_backend"]["source"] == "flag"  # on the launch command


# ---- what is and is not the crash ---------------------------------------------------------------------
def test_a_traceback_the_server_lived_through_is_not_the_crash():
    doc = parse_text(
        "[2025-06-01 10:00:01] Failed to import an optional module, falling back:\n"
        "Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/layers/quantization/__init__.py", line 20, in <module>\n'
        "ModuleNotFoundError: No module named 'vllm'\n"
        "[2025-06-01 10:00:05] Load weight begin. avail mem=78.00 GB\n"
        "[2025-06-01 10:00:21] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1500, in init_memory_pool\n'
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    assert doc["crash"]["exception"] == "RuntimeError" and doc["crash"]["line"] == 6


def test_ctrl_c_a_request_error_and_shutdown_noise_are_not_crashes():
    serving = (
        "[2025-06-01 10:00:00] The server is fired up and ready to roll!\n"
        "[2025-06-01 10:00:01 TP0] Decode batch, #running-req: 1, #token: 90, token usage: 0.00, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0, \n"
    )
    ctrl_c = (
        serving
        + '^CTraceback (most recent call last):\n  File "/x/launch_server.py", line 14, in <module>\nKeyboardInterrupt\n'
    )
    request = serving + (
        "[2025-06-01 10:00:02] Error in request:\nTraceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/tokenizer_manager.py", line 500, in _validate\n'
        "ValueError: The input (40000 tokens) is longer than the model's context length (32768 tokens).\n"
        "[2025-06-01 10:00:03 TP0] Decode batch, #running-req: 1, #token: 95, token usage: 0.00, cuda graph: True, gen throughput (token/s): 51.00, #queue-req: 0, \n"
    )
    ignored = serving + (
        "[2025-06-01 10:05:00] Shutting down\nException ignored in: <function ExecutorBase.__del__ at 0x7f>\n"
        'Traceback (most recent call last):\n  File "/v/executor_base.py", line 9, in __del__\nRuntimeError: cannot join current thread\n'
    )
    for text in (ctrl_c, request, ignored):
        doc = parse_text(text)
        assert doc["crash"] is None and doc["outcome"] == "serving", text


def test_warnings_that_mention_oom_or_nccl_are_not_failures():
    doc = parse_text(
        "WARNING 05-10 12:00:02 [config.py:1000] Using max_model_len=131072 may cause out of memory errors.\n"
        "node1:123:123 [0] NCCL WARN NET/IB : No device found.\n"
    )
    assert doc["crash"] is None and doc["outcome"] == "incomplete"


def test_one_odd_value_in_vllm_non_default_args_keeps_the_others():
    doc = parse_text(
        "INFO 07-10 12:00:01 [cli_args.py:325] non-default args: {'model': 'openai/gpt-oss-120b', "
        "'tensor_parallel_size': 2, 'kv_cache_dtype': 'fp8', 'dtype': torch.bfloat16}\n"
    )
    assert doc["server_args"]["tensor_parallel_size"] == 2 and doc["model"] == "openai/gpt-oss-120b"
    assert doc["backends"]["kv_cache_dtype"] == "fp8"


def test_an_unprefixed_traceback_after_a_rankless_line_has_no_rank():
    doc = parse_text(
        "[2025-06-01 10:00:05 TP3] Load weight begin. avail mem=78.00 GB\n"
        "[2025-06-01 10:00:06] Tokenizer init failed:\n"
        'Traceback (most recent call last):\n  File "/sgl/tokenizer_manager.py", line 200, in __init__\n'
        "OSError: Can't load tokenizer for 'm'.\n"
    )
    assert doc["crash"]["rank"] is None


def test_sglang_inside_ray_is_sglang_with_its_rank():
    doc = parse_text(
        "(SGLangEngine pid=4242) [2025-06-01 10:00:01 TP0] Load weight begin. avail mem=78.00 GB\n"
        "(SGLangEngine pid=4242) [2025-06-01 10:00:02 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '(SGLangEngine pid=4242)   File "/venv/site-packages/sglang/srt/managers/scheduler.py", line 10, in run\n'
        "(SGLangEngine pid=4242) AssertionError: DeepEP requires --enable-dp-attention\n"
    )
    assert doc["server"] == "sglang"
    assert doc["crash"]["rank"] == "TP0" and doc["crash"]["exception"] == "AssertionError"


def test_an_exception_group_traceback_is_recorded():
    doc = parse_text(
        "  + Exception Group Traceback (most recent call last):\n"
        '  |   File "/v/vllm/entrypoints/openai/api_server.py", line 100, in run_server\n'
        "  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n"
        "  +-+---------------- 1 ----------------\n"
        "    | Traceback (most recent call last):\n"
        '    |   File "/v/vllm/engine/multiprocessing/client.py", line 200, in run_output_handler_loop\n'
        "    | vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not running.\n"
        "    +------------------------------------\n"
    )
    assert doc["crash"]["exception"] == "vllm.engine.multiprocessing.MQEngineDeadError"


def test_nccl_debug_lines_name_the_transport_of_each_rank_pair_once():
    doc = parse_text(
        "h200-a:1234:1300 [0] NCCL INFO NCCL version 2.27.7+cuda13.0\n"
        + "".join(
            f"h200-a:1234:1300 [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
            for c in range(16)
        )
        + "h200-a:1235:1301 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read\n"
        "node2:77:80 [3] NCCL INFO Channel 02/1 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA\n"
        "node2:77:80 [3] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via SHM/direct/direct\n"
    )
    assert [(t["a"], t["b"], t["transport"]) for t in doc["nccl_transports"]] == [
        (0, 1, "P2P"),
        (1, 0, "P2P"),
        (3, 4, "NET"),
        (2, 3, "SHM"),
    ]
    assert doc["nccl_transports"][2]["via"] == "NET/IB/0/GDRDMA"
    assert doc["versions"]["nccl"] == "2.27.7"


@pytest.mark.parametrize(
    ("raw", "time", "rank", "msg"),
    [
        # vLLM before 0.7: no bracket around the source
        (
            "INFO 02-08 11:19:09 serving_chat.py:193] Using default chat template",
            "0000-02-08T11:19:09",
            None,
            "Using default chat template",
        ),
        (
            "(APIServer pid=1) INFO 08-23 10:15:02 [api_server.py:1805] vLLM API server version 0.10.1",
            "0000-08-23T10:15:02",
            "APIServer",
            "vLLM API server version 0.10.1",
        ),
        (
            "(EngineCore_DP0 pid=245) ERROR 08-23 10:15:09 [core.py:700] EngineCore failed to start.",
            "0000-08-23T10:15:09",
            "EngineCore_DP0",
            "EngineCore failed to start.",
        ),
        # a worker's output relayed by its parent: the innermost process is the rank
        (
            "(Worker pid=1360047) (Worker_TP1 pid=1360047) ERROR 03-05 09:56:09 [multiproc_executor.py:880] boom",
            "0000-03-05T09:56:09",
            "Worker_TP1",
            "boom",
        ),
        # Ray colours the actor prefix
        (
            "\x1b[36m(VllmWorker rank=1 pid=694622)\x1b[0m INFO 08-14 11:33:20 [gpu_model_runner.py:1892] Model loading took 0.57 GiB",
            "0000-08-14T11:33:20",
            "VllmWorker rank=1",
            "Model loading took 0.57 GiB",
        ),
        (
            "(RayWorkerWrapper pid=5155, ip=10.0.0.2) INFO 08-23 10:15:09 [worker.py:12] ready",
            "0000-08-23T10:15:09",
            "RayWorkerWrapper",
            "ready",
        ),
        # an application's Python logging around vLLM's own line
        (
            "2025-08-13 04:39:39,318 - __main__ - INFO - INFO 08-13 04:39:39 cuda.py:229] Using Flash Attention backend.",
            "0000-08-13T04:39:39",
            None,
            "Using Flash Attention backend.",
        ),
        # printed right after a tqdm bar
        (
            "Running requests:   0%|          | 0/500 [00:00<?, ?it/s]INFO 07-09 03:51:34 [flashinfer.py:123] Using TRTLLM decode",
            "0000-07-09T03:51:34",
            None,
            "Using TRTLLM decode",
        ),
    ],
    ids=[
        "no-bracket",
        "apiserver",
        "enginecore-dp",
        "nested-workers",
        "ray-ansi",
        "ray-ip",
        "py-logging",
        "tqdm",
    ],
)
def test_every_vllm_line_format_gives_its_time_and_rank(raw: str, time: str, rank: str | None, msg: str):
    line = split_line(1, raw)
    assert (line.time, line.rank, line.msg, line.style) == (time, rank, msg, "vllm")


def test_a_tqdm_bar_or_a_logging_prefix_alone_is_not_taken_for_a_vllm_line():
    for raw in (
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.1s/it]",
        "2025-08-13 04:39:39,318 - __main__ - INFO - starting the benchmark",
    ):
        assert split_line(1, raw).style == "plain"


def test_a_big_compressed_log_read_ahead_by_a_thread_keeps_the_expansion_limit(tmp_path, monkeypatch):
    """The parallel parse decompresses in a thread (parallelscan.read_ahead): the limit set around the parse
    still stops it, and the refusal reaches the caller as it did."""
    import gzip

    from dispatchlab.core.parse import sources
    from dispatchlab.core.reading import LogReadError, expansion_limit

    monkeypatch.setattr(sources, "PARALLEL_MIN_COMPRESSED_BYTES", 1024)
    monkeypatch.setenv("DISPATCHLAB_PARSE_WORKERS", "2")
    path = tmp_path / "big.log.gz"
    with gzip.open(path, "wb") as handle:
        handle.write((LOGS / "sglang_h100_serving.log").read_bytes() * 3000)
    assert len(parse_paths([path])["sources"]) == 1  # within the default limit
    with expansion_limit(4 * 1024 * 1024), pytest.raises(LogReadError) as refused:
        parse_paths([path])
    assert "more than 4,194,304 bytes" in str(refused.value) and "DISPATCHLAB_MAX_EXPANDED_BYTES" in str(
        refused.value
    )

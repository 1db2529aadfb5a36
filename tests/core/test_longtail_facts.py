"""Facts the long-tail logs carry: garbage wherever generated text shows, the arch a JIT compile names,
bare lines in their process's lane, vLLM times on the timeline.

Each fixture is a small excerpt written for the test, modelled on logs pasted into public threads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths, parse_paths
from dispatchlab.core.parse.extra import NO_EXTRA_PATTERNS
from dispatchlab.core.parse.rules import compiled_rules
from dispatchlab.core.parse.sources import scan_sources

from .helpers import text_source

CHAT_JSON_LOOP = """\
INFO 08-06 10:12:01 [api_server.py:1818] Starting vLLM API server 0 on http://0.0.0.0:8000
$ curl -s http://localhost:8000/v1/chat/completions -H "Content-Type: application/json" -d '{
  "model": "Qwen/Qwen3-30B-A3B-FP8",
  "messages": [{"role": "user", "content": "Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello"}]
}' | jq
{
  "id": "chatcmpl-5c1f0e8a",
  "object": "chat.completion",
  "created": 1754471000,
  "model": "Qwen/Qwen3-30B-A3B-FP8",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": " The The The The The The The The The The The The The The The The",
        "tool_calls": []
      },
      "finish_reason": "length"
    }
  ]
}
"""

BARE_OUTPUT_LOOP = """\
INFO 05-12 14:02:11 [llm_engine.py:431] init engine (profile, create kv cache, warmup model) took 21.4 seconds
Processed prompts: 100%|██████████| 1/1 [00:01<00:00,  1.52s/it, est. speed input: 9.2 tok/s, output: 84.0 tok/s]
/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/a09a35458c702b33eeacc393d103063234e8bc28
==================================================================================
Sure!<unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk><unk>
"""

GENERATE_NOISE = """\
[2025-03-02 09:14:40] The server is fired up and ready to roll!
curl -s http://localhost:30000/generate -H "Content-Type: application/json" -d '{"text": "Die Hauptstadt von Deutschland ist"}'
{"text":" Berlin quelleнияstadt 的 gezeichnetส่วน Vogel ثم Haus kaltenの fern Wegска Lampe тих tiefe","meta_info":{"id":"7e1","prompt_tokens":6,"completion_tokens":24}}
"""

MULTILINGUAL_CLEAN = """\
[2025-03-02 09:14:40] The server is fired up and ready to roll!
{"text":" 巴黎是法国的首都。Paris is the capital of France. Париж — столица Франции. パリはフランスの首都です。","meta_info":{"id":"a1","prompt_tokens":9,"completion_tokens":31}}
{"id":"chatcmpl-2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"当然可以！下面是用Python写的快速排序：\\n\\ndef quicksort(arr):\\n    return arr\\n\\n时间复杂度是O(n log n)。"},"finish_reason":"stop"}]}
{"id":"chatcmpl-3","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Bonjour ! Voici la réponse : 東京は日本の首都です。서울은 한국의 수도입니다. CUDA error: no, everything works."},"finish_reason":"stop"}]}
"""

SERVER_OUTPUT_LINES = """\
[2025-07-01 11:00:02] Finish: obj=GenerateReqInput(text='Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello Hello', sampling_params={'max_new_tokens': 32}), out={'text': ' Paris is the capital of France.', 'meta_info': {'id': 'r1', 'finish_reason': {'type': 'stop'}}}
(APIServer pid=1) INFO 07-01 11:00:05 [logger.py:71] Generated response chatcmpl-9f2: output: '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!', output_token_ids: [0, 0, 0, 0], finish_reason: length
"""


def _write(tmp_path: Path, text: str, name: str = "case.log") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _garbage(doc: dict) -> list[dict]:
    return [e for e in doc["errors"] if e["kind"] == "garbage_output"]


def _served_line(text: str) -> int | None:
    return scan_sources([text_source(text)], compiled_rules(NO_EXTRA_PATTERNS)).served_line


# ---- garbage wherever generated text shows ---------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        # the answer's line, not the repeated prompt's (line 4)
        (CHAT_JSON_LOOP, 16, "'The' is repeated 16 times"),
        # the path and the rule above it are not answers
        (BARE_OUTPUT_LOOP, 5, "'<unk>' is repeated 17 times"),
        (GENERATE_NOISE, 3, "random pieces of 5 scripts"),
    ],
    ids=["response-json-loop", "bare-output-line", "generate-mixed-scripts"],
)
def test_garbage_in_generated_text_is_a_garbage_output_error_with_its_reason(tmp_path, text, line, reason):
    doc = analyze_paths([_write(tmp_path, text)])
    garbage = _garbage(doc)
    assert [e["line"] for e in garbage] == [line]
    assert reason in garbage[0]["text"]
    assert doc["failure_class"] == "garbage_output"


def test_a_pasted_answer_proves_the_server_answered():
    assert _served_line(CHAT_JSON_LOOP) == 16


def test_clean_multilingual_answers_are_not_garbage_and_prove_the_server_answered(tmp_path):
    doc = analyze_paths([_write(tmp_path, MULTILINGUAL_CLEAN)])
    assert _garbage(doc) == []
    # the words of an answer are not the server's own error
    assert not any("CUDA error" in e["text"] for e in doc["errors"])
    assert doc["failure_class"] == "none"
    assert _served_line(MULTILINGUAL_CLEAN) == 2


def test_server_lines_that_print_outputs_are_judged_on_the_output_not_the_prompt(tmp_path):
    doc = parse_paths([_write(tmp_path, SERVER_OUTPUT_LINES)])
    garbage = _garbage(doc)
    assert [e["line"] for e in garbage] == [2]
    assert "'!'" in garbage[0]["text"]
    assert _served_line(SERVER_OUTPUT_LINES) == 1


def test_a_request_alone_does_not_say_the_server_answered():
    request = 'curl http://localhost:8000/v1/chat/completions -d \'{"messages": [{"role": "user", "content": "hi"}]}\'\n'
    assert _served_line(request) is None


# ---- the arch a JIT compile names --------------------------------------------------------------------
PTXAS = """\
Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/triton/backends/nvidia/compiler.py", line 430, in make_cubin
    raise PTXASError(error)
triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX codegen error
`ptxas` stderr:
ptxas fatal   : Unknown option '-warn-lmem-usage'

Repro command: /usr/lib/python3.12/site-packages/triton/backends/nvidia/bin/ptxas -lineinfo -v --gpu-name=sm_120a /tmp/tmpa1b2.ptx -o /tmp/tmpa1b2.ptx.o
"""

GENCODE = """\
Emitting ninja build file /root/.cache/torch_extensions/py312_cu128/fused_rope/build.ninja...
[1/2] /usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=fused_rope -O3 --generate-code=arch=compute_89,code=[compute_89,sm_89] -c /root/.cache/torch_extensions/py312_cu128/fused_rope/rope.cu -o rope.cuda.o
FAILED: rope.cuda.o
"""

AOT_GENCODE = """\
building 'sgl_kernel.common_ops' extension
/usr/local/cuda/bin/nvcc -c csrc/gemm.cu -o build/gemm.o -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a
"""

FLASHINFER_CACHE = """\
  File "/usr/lib/python3.10/site-packages/flashinfer/jit/cpp_ext.py", line 241, in run_ninja
    subprocess.run(
subprocess.CalledProcessError: Command '['ninja', '-v', '-C', '/home/svc/.cache/flashinfer/0.4.1/100a/cached_ops', '-f', '/home/svc/.cache/flashinfer/0.4.1/100a/cached_ops/batch_decode/build.ninja']' returned non-zero exit status 1.
"""


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        (PTXAS, "sm_120"),
        (GENCODE, "sm_89"),
        (FLASHINFER_CACHE, "sm_100"),
        # a wheel's build names several targets, and a cache directory of several archs names none
        (AOT_GENCODE, None),
        (FLASHINFER_CACHE.replace("0.4.1/100a", "75_80_89_90"), None),
    ],
    ids=["ptxas-gpu-name", "nvcc-generate-code", "flashinfer-cache-path", "aot-gencode", "multi-arch-cache"],
)
def test_a_jit_compile_for_the_device_names_its_arch(tmp_path, text: str, arch: str | None):
    assert parse_paths([_write(tmp_path, text)])["gpu"]["arch"] == arch


def test_what_the_device_says_of_itself_outranks_a_jit_target(tmp_path):
    text = "WARNING: detected compute capability 9.0 for device 0\n" + PTXAS
    assert parse_paths([_write(tmp_path, text)])["gpu"]["arch"] == "sm_90"


def test_a_jit_target_outranks_a_kernel_name(tmp_path):
    text = "RuntimeError: no kernel for fmhaSm100Kernel_bf16 on this device\n" + GENCODE
    assert parse_paths([_write(tmp_path, text)])["gpu"]["arch"] == "sm_89"


# ---- bare lines in their process's lane ---------------------------------------------------------------
def test_an_unprefixed_line_joins_the_lane_of_the_process_printing_around_it(tmp_path):
    text = (
        "[2025-06-01 10:00:05 TP3] Load weight begin. avail mem=78.00 GB\n"
        "CUDA error: an illegal memory access was encountered\n"
        "(Worker_TP1 pid=812) INFO 06-01 10:00:07 [gpu_model_runner.py:1892] Loading model\n"
        "Capture cuda graph begin. This can take up to several minutes.\n"
    )
    doc = parse_paths([_write(tmp_path, text)])
    error = next(e for e in doc["errors"] if "illegal memory access" in e["text"])
    assert error["rank"] == "TP3"
    assert {e["rank"] for e in doc["timeline"] if e["line"] == 2} == {"TP3"}
    assert {e["rank"] for e in doc["timeline"] if e["line"] == 4} == {"Worker_TP1"}
    assert "None" not in doc["ranks"] and None not in doc["ranks"]


# ---- vLLM times on the timeline -------------------------------------------------------------------------
VLLM_FORMATS = """\
INFO 02-08 11:19:09 serving_chat.py:193] Using default chat template
(APIServer pid=1) INFO 08-23 10:15:02 [api_server.py:1805] vLLM API server version 0.10.1
(EngineCore_DP0 pid=245) INFO 08-23 10:15:09 [core.py:75] Initializing a V1 LLM engine
(Worker pid=1360047) (Worker_TP1 pid=1360047) ERROR 08-23 10:16:09 [multiproc_executor.py:880] CUDA error: an illegal memory access was encountered
\x1b[36m(VllmWorker rank=1 pid=694622)\x1b[0m ERROR 08-23 10:16:10 [multiproc_executor.py:880] NCCL error: unhandled cuda error
2025-08-23 10:16:11,318 - __main__ - INFO - ERROR 08-23 10:16:11 engine.py:400] CUDA error: no kernel image is available for execution on the device
Processed prompts:   0%|          | 0/500 [00:00<?, ?it/s]ERROR 08-23 10:16:12 [core.py:700] EngineCore failed to start.
"""


def test_every_vllm_line_format_puts_its_events_on_the_timeline_with_time_and_rank(tmp_path):
    doc = parse_paths([_write(tmp_path, VLLM_FORMATS)])
    errors = {e["line"]: e for e in doc["errors"]}
    assert {line: errors[line]["time"][5:] for line in (4, 5, 6, 7)} == {
        4: "08-23T10:16:09",
        5: "08-23T10:16:10",
        6: "08-23T10:16:11",
        7: "08-23T10:16:12",
    }
    assert errors[4]["rank"] == "Worker_TP1"
    assert errors[5]["rank"] == "VllmWorker rank=1"
    assert doc["server"] == "vllm"


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        ("1 error generated when compiling for gfx90a.\n", "gfx90a"),
        ("  Name:                    gfx942\n", "gfx942"),
        ("hsaco: /opt/aiter/hsa/gfx950/fmoe/fmoe_bf16_kernel.co\n", "gfx950"),
        # a build list names several targets, so none is the device's
        ("PYTORCH_ROCM_ARCH='gfx90a;gfx942;gfx1100'\n", None),
    ],
)
def test_an_amd_gfx_target_is_read_from_errors_and_device_lines(tmp_path, text: str, arch: str | None):
    log = tmp_path / "amd.log"
    log.write_text(text)
    assert analyze_paths([log])["gpu"]["arch"] == arch


# ---- answers read from more places ---------------------------------------------------------------------
TRITON_OUTPUT = (
    '{"model_name":"ensemble","model_version":"1","text_output":"def main():' + " py" * 20 + '"}\n'
)
LABELLED_OUTPUT = 'Input: "The capital of France is"\nOutput: "Paris, and' + " the" * 30 + '"\n'
TEMPLATE_LOOP = "<|im_start|>" * 40 + "\n"
TRAINER_SAMPLE = (
    "(main_task pid=360402)  Answer:\n(main_task pid=360402) Let's think step by step. "
    + "camin naman " * 12
    + "Encode " * 30
    + "\n"
)


@pytest.mark.parametrize(
    "text",
    [TRITON_OUTPUT, LABELLED_OUTPUT, TEMPLATE_LOOP, TRAINER_SAMPLE],
    ids=["triton-text-output", "labelled-output", "special-token-loop", "trainer-rollout-sample"],
)
def test_a_looping_answer_is_garbage_wherever_the_log_shows_it(tmp_path, text):
    doc = analyze_paths([_write(tmp_path, text)])
    assert len(_garbage(doc)) == 1
    assert doc["failure_class"] == "garbage_output"


CLEAN_PLACES = """\
{"model_name":"ensemble","text_output":"def main():\\n    print('hello')"}
Output [Text 0 Beam 0]: "Paris is the capital and largest city of France."
assistant : The capital of the United States is Washington, D.C.
(main_task pid=1) Reward: [nan nan nan nan nan nan nan nan nan nan nan nan nan nan nan nan]
(main_task pid=1) Fa la la la la la la la la, ho ho ho ho ho ho ho ho ho, merry merry Christmas to all of you my friends
"""


def test_clean_answers_in_those_places_and_repeated_array_values_are_not_garbage(tmp_path):
    doc = analyze_paths([_write(tmp_path, CLEAN_PLACES)])
    assert _garbage(doc) == []
    assert doc["failure_class"] == "none"
    assert _served_line(CLEAN_PLACES) == 1

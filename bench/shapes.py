"""Generated logs of every shape a user uploads (no corpus files): each writer streams `size` bytes to a path.

launch: a serving log (the shared generator, ../shared/bench/gen.py, else genlog.py); crash_loop: one
real-shaped SGLang crash on sm_120 (TP4, a Scheduler exception in CUDA-graph capture through FlashInfer's
TRT-LLM MoE), restarted by a supervisor again and again; traceback_flood: 10,000 distinct tracebacks among
serving lines; ranks64: 64 ranks starting, serving and failing with their lines interleaved; long_lines:
1 MB request dumps between serving lines; no_newline: a log stored as one JSON string (no newline at all);
binary_junk: a serving log with a core dump's worth of random bytes in its middle.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

SHARED_GEN = Path(__file__).resolve().parents[2] / "shared" / "bench" / "gen.py"
if not SHARED_GEN.exists():
    SHARED_GEN = Path("/work/shared/bench/gen.py")

_T0 = datetime(2026, 3, 2, 9, 15, 0)
_ARGS = (
    "server_args=ServerArgs(model_path='/models/DeepSeek-V4-Flash-NVFP4', tokenizer_path='/models/DeepSeek-V4-Flash-NVFP4', "
    "tokenizer_mode='auto', load_format='auto', trust_remote_code=True, dtype='auto', kv_cache_dtype='auto', "
    "quantization=None, context_length=8192, mem_fraction_static=0.82, tp_size=4, dp_size=1, ep_size=1, "
    "attention_backend='flashinfer', sampling_backend='flashinfer', grammar_backend='xgrammar', "
    "moe_runner_backend='triton', speculative_algorithm='EAGLE', speculative_num_steps=3, "
    "speculative_eagle_topk=1, speculative_num_draft_tokens=4, speculative_moe_runner_backend='triton', "
    "cuda_graph_max_bs=64, disable_cuda_graph=False, enable_torch_compile=False, random_seed={seed}, "
    "host='0.0.0.0', port=30000, watchdog_timeout=300, log_level='info', enable_metrics=True)"
)
_FRAMES = [
    ("/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", 2911, "run_scheduler_process"),
    ("/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", 318, "__init__"),
    ("/sgl-workspace/sglang/python/sglang/srt/managers/tp_worker.py", 84, "__init__"),
    ("/sgl-workspace/sglang/python/sglang/srt/speculative/eagle_worker.py", 131, "__init__"),
    ("/sgl-workspace/sglang/python/sglang/srt/speculative/eagle_worker.py", 212, "init_cuda_graphs"),
    ("/sgl-workspace/sglang/python/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", 98, "__init__"),
    ("/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", 402, "capture"),
    (
        "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py",
        511,
        "capture_one_batch_size",
    ),
    ("/sgl-workspace/sglang/python/sglang/srt/models/deepseek_v4_nextn.py", 145, "forward"),
    ("/usr/local/lib/python3.12/dist-packages/torch/nn/modules/module.py", 1773, "_wrapped_call_impl"),
    ("/sgl-workspace/sglang/python/sglang/srt/models/deepseek_v4.py", 688, "forward"),
    ("/sgl-workspace/sglang/python/sglang/srt/layers/moe/fused_moe_triton/layer.py", 943, "forward"),
    ("/sgl-workspace/sglang/python/sglang/srt/layers/quantization/mxfp4.py", 711, "apply"),
    (
        "/usr/local/lib/python3.12/dist-packages/flashinfer/fused_moe/core.py",
        1877,
        "trtllm_fp4_block_scale_routed_moe",
    ),
    (
        "/usr/local/lib/python3.12/dist-packages/flashinfer/fused_moe/core.py",
        1450,
        "trtllm_fp4_block_scale_moe_op",
    ),
]
_CRASH = (
    "RuntimeError: Error in function 'run' at /workspace/csrc/trtllm_batched_gemm_runner.cu:254: "
    "No kernel found for the given options: bmm_MxE4m3_MxE2m1E2m1_Fp32_t128x8x512_s3_et128x8_m128x8x32_cga1x1x1_"
    "16dp256b_TN_transOut_schedS_bN_dynBatch_sm100a (compute capability 12.0 of this GPU, required 10.0)"
)


def _ts(seconds: float) -> str:
    return (_T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")


def crash_run(attempt: int) -> str:
    """One start of a TP4 SGLang server that crashes in CUDA-graph capture on sm_120, as a supervisor logs it."""
    t = attempt * 95.0
    lines = [
        f"+ python3 -m sglang.launch_server --model-path /models/DeepSeek-V4-Flash-NVFP4 --tp 4 "
        f"--speculative-algorithm EAGLE --moe-runner-backend triton --port 30000   # attempt {attempt + 1}",
        f"[{_ts(t)}] {_ARGS.format(seed=1000 + attempt)}",
        f"[{_ts(t)}] Using default HuggingFace chat template with detected content format: string",
    ]
    for r in range(4):
        lines += [
            f"[{_ts(t + 4)} TP{r}] Init torch distributed begin.",
            f"[{_ts(t + 5)} TP{r}] Init torch distributed ends. mem usage=0.41 GB",
            f"[{_ts(t + 6)} TP{r}] Load weight begin. avail mem=93.12 GB",
            f"[{_ts(t + 6)} TP{r}] DeepGemm is enabled but the scale_fmt of checkpoint is not ue8m0. "
            "This might cause accuracy degradation on Blackwell.",
            f"[{_ts(t + 31)} TP{r}] Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, "
            "avail mem=52.40 GB, mem usage=40.72 GB.",
            f"[{_ts(t + 32)} TP{r}] KV Cache is allocated. #tokens: 1048576, KV size: 18.25 GB",
            f"[{_ts(t + 33)} TP{r}] Memory pool end. avail mem=33.90 GB",
            f"[{_ts(t + 34)} TP{r}] Capture cuda graph begin. This can take up to several minutes. avail mem=33.10 GB",
        ]
    for r in range(4):
        lines.append(f"[{_ts(t + 41)} TP{r}] Scheduler hit an exception: Traceback (most recent call last):")
        for file, number, function in _FRAMES:
            lines += [
                f'  File "{file}", line {number}, in {function}',
                "    return self._call_impl(*args, **kwargs)",
            ]
        lines.append(_CRASH)
        lines.append("")
    lines += [
        f"[{_ts(t + 41)}] Received sigquit from a child process. It usually means the child failed.",
        "Killed",
        f"supervisor: sglang exited with code 137 at {_ts(t + 42)}; restarting in 5 s (attempt {attempt + 2})",
    ]
    return "\n".join(lines) + "\n"


def _serving(rng: random.Random, t: float, rank: str = "TP0") -> str:
    if rng.random() < 0.7:
        return (
            f"[{_ts(t)} {rank}] Decode batch, #running-req: {rng.randint(1, 64)}, #token: {rng.randint(1000, 90000)}, "
            f"token usage: {rng.random():.2f}, cuda graph: True, gen throughput (token/s): {rng.uniform(100, 3000):.2f}, "
            f"#queue-req: {rng.randint(0, 9)}"
        )
    return f'[{_ts(t)}] INFO:     10.1.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{rng.randint(1024, 65535)} - "POST /v1/chat/completions HTTP/1.1" 200 OK'


_EXCEPTIONS = (
    "RuntimeError",
    "ValueError",
    "KeyError",
    "AssertionError",
    "torch.OutOfMemoryError",
    "TypeError",
)
_MODULES = ("scheduler", "tp_worker", "model_runner", "cuda_graph_runner", "radix_cache", "schedule_batch")


def distinct_traceback(n: int, t: float) -> str:
    """Traceback number `n` of 10,000: its frames and its message differ from every other's."""
    rng = random.Random(n)
    lines = [f"[{_ts(t)} TP{n % 8}] Scheduler hit an exception: Traceback (most recent call last):"]
    for depth in range(rng.randint(6, 14)):
        module = _MODULES[(n + depth) % len(_MODULES)]
        lines += [
            f'  File "/sgl-workspace/sglang/python/sglang/srt/managers/{module}.py", line {rng.randint(10, 4000)}, '
            f"in handler_{n}_{depth}",
            f"    result = self.step_{depth}(batch, forward_mode={rng.randint(0, 3)})",
        ]
    lines.append(
        f"{_EXCEPTIONS[n % len(_EXCEPTIONS)]}: unexpected state {n} in request batch {n * 7919 % 100003}"
    )
    return "\n".join(lines) + "\n"


def _fill(path: Path, size: int, blocks: Iterator[str]) -> None:
    written = 0
    with path.open("w", encoding="utf-8", newline="\n") as out:
        for block in blocks:
            out.write(block)
            written += len(block)
            if written >= size:
                return


def launch(path: Path, size: int) -> None:
    if SHARED_GEN.exists():
        subprocess.run([sys.executable, str(SHARED_GEN), str(path), str(size), "7"], check=True)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from genlog import write_log

        write_log(path, size, 7)


def crash_loop(path: Path, size: int) -> None:
    def blocks() -> Iterator[str]:
        attempt = 0
        while True:
            yield crash_run(attempt)
            attempt += 1

    _fill(path, size, blocks())


def traceback_flood(path: Path, size: int, count: int = 10_000) -> None:
    tracebacks_bytes = sum(len(distinct_traceback(n, 0)) for n in range(0, count, 100)) * 100
    filler_per_tb = max(0, (size - tracebacks_bytes) // count)

    def blocks() -> Iterator[str]:
        rng = random.Random(3)
        t = 0.0
        n = 0
        while True:
            filler, made = [], 0
            while made < filler_per_tb:
                t += 0.05
                line = _serving(rng, t) + "\n"
                filler.append(line)
                made += len(line)
            yield "".join(filler)
            if n < count:
                yield distinct_traceback(n, t)
                n += 1

    _fill(path, size, blocks())


def ranks64(path: Path, size: int) -> None:
    ranks = [f"DP{r // 8} TP{r % 8} EP{r % 8}" for r in range(64)]

    def blocks() -> Iterator[str]:
        rng = random.Random(64)
        yield f"[{_ts(0)}] {_ARGS.format(seed=64)}\n"
        for step in (
            "Init torch distributed begin.",
            "Load weight begin. avail mem=78.00 GB",
            "KV Cache is allocated. #tokens: 400000, KV size: 20.10 GB",
            "Capture cuda graph begin. This can take up to several minutes. avail mem=20.00 GB",
        ):
            yield "".join(f"[{_ts(5)} {rank}] {step}\n" for rank in ranks)
        t = 60.0
        while True:
            out = []
            for _ in range(2000):
                t += 0.001
                out.append(_serving(rng, t, rng.choice(ranks)) + "\n")
            if rng.random() < 0.02:  # every rank reports the same watchdog stall, interleaved
                out += [
                    f"[{_ts(t)} {rank}] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=True)\n"
                    for rank in ranks
                ]
                # and the same traceback from every rank, lines interleaved (torchrun's [rankN]: prefix)
                frames = [f'  File "{f}", line {n}, in {fn}' for f, n, fn in _FRAMES[:8]]
                for line in [
                    "Traceback (most recent call last):",
                    *frames,
                    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited",
                ]:
                    out += [f"[rank{r}]: {line}\n" for r in range(64)]
            yield "".join(out)

    _fill(path, size, blocks())


def long_lines(path: Path, size: int) -> None:
    words = [
        "the",
        "quick",
        "summary",
        "of",
        "the",
        "attached",
        "design",
        "document",
        "explains",
        "why",
        "the",
        "cache",
        "layer",
        "matters",
    ]

    def blocks() -> Iterator[str]:
        rng = random.Random(11)
        t = 0.0
        while True:
            out = []
            for _ in range(50):
                t += 0.1
                out.append(_serving(rng, t) + "\n")
            prompt = " ".join(rng.choice(words) for _ in range(200_000))[: 1 << 20]
            out.append(
                f"[{_ts(t)}] Receive: obj=GenerateReqInput(rid='{rng.getrandbits(64):016x}', text='{prompt}')\n"
            )
            yield "".join(out)

    _fill(path, size, blocks())


def no_newline(path: Path, size: int) -> None:
    def blocks() -> Iterator[str]:
        rng = random.Random(5)
        yield '{"log": "'
        t = 0.0
        while True:
            out = []
            for _ in range(2000):
                t += 0.05
                out.append(_serving(rng, t).replace('"', '\\"') + "\\n")
            yield "".join(out)

    _fill(path, size, blocks())
    with path.open("a") as out:
        out.write('"}')


def binary_junk(path: Path, size: int) -> None:
    launch(path, size * 45 // 100)
    tail = path.with_suffix(".tail")
    launch(tail, size * 45 // 100)
    rng = random.Random(13)
    with path.open("ab") as out:
        left = size // 10
        while left > 0:
            block = rng.randbytes(min(left, 1 << 20))
            out.write(block)
            left -= len(block)
        out.write(b"\n")
        out.write(tail.read_bytes())
    tail.unlink()


SHAPES: dict[str, Callable[[Path, int], None]] = {
    "launch": launch,
    "crash_loop": crash_loop,
    "traceback_flood": traceback_flood,
    "ranks64": ranks64,
    "long_lines": long_lines,
    "no_newline": no_newline,
    "binary_junk": binary_junk,
}

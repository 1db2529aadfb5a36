"""A realistic big SGLang/vLLM serving log for the benchmarks (modelled on ../shared/research/perf-anchors.md):
60% decode statistics, 27% access log, 10% prefill statistics, 2% vLLM statistics, 1% health checks, and
rare incidents (restart blocks with a ServerArgs dump and milestones, tracebacks, CUDA/NCCL error lines)."""

from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

DUMP = (
    "server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', tokenizer_path='deepseek-ai/DeepSeek-V3', "
    "tokenizer_mode='auto', load_format='auto', trust_remote_code=True, dtype='auto', kv_cache_dtype='fp8_e4m3', "
    "quantization='fp8', context_length=65536, mem_fraction_static=0.85, tp_size=8, dp_size=1, ep_size=8, "
    "attention_backend='flashinfer', sampling_backend='flashinfer', grammar_backend='xgrammar', "
    "moe_runner_backend='auto', moe_a2a_backend='none', speculative_algorithm=None, fp8_gemm_runner_backend='auto', "
    + ", ".join(
        f"option_{i}={random.Random(i).choice(['None', 'True', 'False', repr('value'), str(i)])}"
        for i in range(160)
    )
    + ")"
)
TRACEBACKS = [
    (
        "torch.OutOfMemoryError",
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.19 GiB",
    ),
    ("RuntimeError", "CUDA error: an illegal memory access was encountered"),
    (
        "torch.distributed.DistBackendError",
        "NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error",
    ),
    (
        "ImportError",
        "/usr/lib/python3/dist-packages/sgl_kernel/common_ops.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
    ),
    ("ValueError", "The memory capacity is unbalanced. Some GPUs may be occupied by other processes."),
]
ERRORS = [
    "[{ts} TP{r}] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
    "host:1234:1299 [{r}] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1234> with error 12, opcode 0",
    "[{ts} TP{r}] CUDA error: misaligned address",
    "[{ts} TP{r}] Decode out of memory happened. #retracted_reqs: 3, #new_token_ratio: 0.4",
    "(EngineCore_DP0 pid=3301) ERROR {md} {hms} [core.py:718] EngineCore encountered a fatal error.",
]


def _restart(ts: str) -> list[str]:
    lines = [f"[{ts}] {DUMP}"]
    for r in range(4):
        lines += [
            f"[{ts} TP{r}] Init torch distributed begin.",
            f"[{ts} TP{r}] Load weight begin. avail mem=78.12 GB",
            f"[{ts} TP{r}] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=40.01 GB, mem usage=38.11 GB.",
            f"[{ts} TP{r}] KV Cache is allocated. #tokens: 412352, KV size: 24.11 GB",
            f"[{ts} TP{r}] Capture cuda graph begin. This can take up to several minutes. avail mem=15.88 GB",
            f"[{ts} TP{r}] Capture cuda graph end. Time elapsed: 9.37 s. mem usage=0.71 GB. avail mem=15.09 GB.",
        ]
    lines += [
        f"[{ts} TP0] max_total_num_tokens=412352, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=512, context_len=65536, available_gpu_mem=15.09 GB",
        f"[{ts}] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
        f"[{ts}] The server is fired up and ready to roll!",
    ]
    return lines


def _traceback(ts: str, rng: random.Random) -> list[str]:
    exc, msg = rng.choice(TRACEBACKS)
    rank = rng.randrange(8)
    frames = rng.randrange(3, 10)
    lines = [f"[{ts} TP{rank}] Scheduler hit an exception: Traceback (most recent call last):"]
    for i in range(frames):
        lines.append(
            f'  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line {100 + i * 37}, in step_{i}'
        )
        lines.append(f"    self.step_{i + 1}(batch)")
    lines += [
        f"{exc}: {msg}",
        "",
        f"[{ts}] Received sigquit from a child process. It usually means the child failed.",
    ]
    return lines


def write_log(path: Path, size: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    clock = datetime(2026, 3, 1, 8, 0, 0)
    running = 32
    written = 0
    paths = ["/generate", "/v1/chat/completions", "/v1/completions", "/health"]
    with path.open("w", encoding="utf-8", newline="\n") as out:
        while written < size:
            batch: list[str] = []
            for _ in range(2000):
                if rng.random() < 0.02:
                    clock += timedelta(seconds=1)
                ts = clock.strftime("%Y-%m-%d %H:%M:%S")
                roll = rng.random()
                if roll < 5e-5:
                    kind = rng.random()
                    if kind < 0.3:
                        batch += _restart(ts)
                    elif kind < 0.7:
                        batch += _traceback(ts, rng)
                    else:
                        md, hms = clock.strftime("%m-%d"), clock.strftime("%H:%M:%S")
                        batch.append(rng.choice(ERRORS).format(ts=ts, r=rng.randrange(8), md=md, hms=hms))
                elif roll < 0.60:
                    running = max(1, min(512, running + rng.randint(-3, 3)))
                    batch.append(
                        f"[{ts} TP{rng.randrange(4)}] Decode batch, #running-req: {running}, #token: {running * 900}, "
                        f"token usage: {running / 600:.2f}, cuda graph: True, gen throughput (token/s): {rng.uniform(500, 4000):.2f}, "
                        f"#queue-req: {rng.randrange(4)}, "
                    )
                elif roll < 0.87:
                    status = (
                        "200 OK"
                        if rng.random() > 0.005
                        else rng.choice(["500 Internal Server Error", "400 Bad Request"])
                    )
                    batch.append(
                        f"[{ts}] INFO:     10.0.{rng.randrange(255)}.{rng.randrange(255)}:{rng.randrange(30000, 60000)} - "
                        f'"POST {rng.choice(paths)} HTTP/1.1" {status}'
                    )
                elif roll < 0.97:
                    batch.append(
                        f"[{ts} TP0] Prefill batch, #new-seq: {rng.randrange(1, 9)}, #new-token: {rng.randrange(64, 8192)}, "
                        f"#cached-token: {rng.randrange(0, 4096)}, token usage: {running / 600:.2f}, #running-req: {running}, "
                        f"#queue-req: {rng.randrange(4)}, "
                    )
                elif roll < 0.99:
                    batch.append(
                        f"INFO {clock.strftime('%m-%d %H:%M:%S')} [loggers.py:123] Engine 000: Avg prompt throughput: "
                        f"{rng.uniform(0, 9000):.1f} tokens/s, Avg generation throughput: {rng.uniform(0, 4000):.1f} tokens/s, "
                        f"Running: {running} reqs, Waiting: 0 reqs, GPU KV cache usage: {running / 6:.1f}%, Prefix cache hit rate: 41.2%"
                    )
                else:
                    batch.append(
                        f'[{ts}] INFO:     127.0.0.1:{rng.randrange(30000, 60000)} - "GET /health HTTP/1.1" 200 OK'
                    )
            text = "\n".join(batch) + "\n"
            out.write(text)
            written += len(text)


if __name__ == "__main__":
    write_log(Path(sys.argv[1]), int(float(sys.argv[2])), int(sys.argv[3]) if len(sys.argv) > 3 else 1)

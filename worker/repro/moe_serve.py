"""`python -m worker.repro moe-serve`: an OpenAI-compatible server whose every step runs one MoE layer
on the chosen runner backend, for confirming MoE-backend fixes where SGLang itself is not installed.

It starts the way an SGLang server does and logs the same milestones (so dispatchlab parses its output
into a timeline): weights, the MoE runner backend, a warm-up of the MoE kernel at several batch sizes
("CUDA graph capture"), then ready. A backend the chip cannot run fails in that warm-up with the
library's own exception, as the crashed server did. Serving, each generated token runs the layer on the
backend and on a plain torch reference: with `--load-format reference` a step whose result matches the
reference emits the next word of a fixed reference answer and a step that does not emits "!" (what a
wrong kernel does to a real model's logits); `--load-format dummy` samples from random weights over a
vocabulary of many scripts, as a real server with dummy weights does. It is a stand-in for the model,
not a model: what it tests is the kernel.

Every backend is compared with the reference, and none of them is the reference: `torch` is a
token-sorted per-expert loop in the model's dtype (the shape of a torch-native MoE path), the reference
a float32 loop over (token, slot) pairs. `flashinfer_trtllm` first asks `worker.inventory`
whether FlashInfer's downloaded cubins are on the host and, where FlashInfer is installed but they are
neither installed nor downloadable, fails at once with `missing_artifacts` and the fix instead of waiting
on FlashInfer's download retries.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BACKENDS = ("auto", "torch", "triton", "flashinfer_cutlass", "flashinfer_trtllm")
REFERENCE_ANSWER = [
    "Paris.",
    "It",
    "is",
    "the",
    "largest",
    "city",
    "of",
    "France",
    "and",
    "sits",
    "on",
    "the",
    "Seine",
    "in",
    "the",
    "north",
    "of",
    "the",
    "country.",
    "The",
    "city",
    "has",
    "been",
    "the",
    "seat",
    "of",
    "the",
    "government",
    "for",
    "centuries,",
    "and",
    "its",
    "museums,",
    "bridges",
    "and",
    "cafes",
    "draw",
    "visitors",
    "from",
    "every",
    "continent.",
    "Around",
    "twelve",
    "million",
    "people",
    "live",
    "in",
    "the",
    "wider",
    "region,",
    "which",
    "is",
    "also",
    "the",
    "economic",
    "centre",
    "of",
    "the",
    "nation,",
    "with",
    "banks,",
    "universities,",
    "publishers",
    "and",
    "research",
    "institutes",
    "spread",
    "across",
    "its",
    "districts",
    "and",
    "suburbs.",
]
# Pieces a byte-level tokenizer decodes random ids into: many scripts, stray marks.
NOISE_VOCAB = [
    "дом",
    "的",
    "ของ",
    "مر",
    "xq",
    "三",
    "ж",
    "ك",
    "ข",
    "्र",
    "ά",
    "ü",
    "ß",
    "丁",
    "ня",
    "ト",
    "ㅂ",
    "ין",
    "ё",
    "ɣ",
    "ʃ",
    "ő",
    "ž",
    "ق",
    "北",
    "ป",
    "ग",
    "ה",
    "ñ",
]


def resolve_backend(requested: str, device: str) -> str:
    """`auto` picks a runner every GPU runs, as SGLang's resolution picks Triton for BF16 MoE on Hopper:
    the Triton runner where Triton and a GPU are there, else plain torch."""
    if requested != "auto":
        return requested
    if device == "cpu":
        return "torch"
    import importlib.util

    import torch

    # trtllm-gen is never chosen here: the repro's FP4 weights are placeholders (trtllm_call.py).
    return (
        "triton" if importlib.util.find_spec("triton") is not None and torch.cuda.is_available() else "torch"
    )


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%Y-%m-%d %H:%M:%S}] {message}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker.repro moe-serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model-path", required=True, help="a folder with config.json (MoE shapes)")
    parser.add_argument("--moe-runner-backend", choices=BACKENDS, default="flashinfer_trtllm")
    parser.add_argument("--load-format", choices=("reference", "dummy"), default="reference")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--tp-size", "--tp", type=int, default=1)
    parser.add_argument("--cuda-graph-max-bs", type=int, default=8)
    parser.add_argument("--random-seed", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    return parser


class MoELayer:
    """One MoE layer with random (seeded) weights; `forward` on the backend, `reference` in torch."""

    def __init__(self, config: dict[str, Any], args: argparse.Namespace) -> None:
        import torch

        self.torch = torch
        self.backend = resolve_backend(args.moe_runner_backend, args.device)
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, args.dtype)
        self.hidden = int(config.get("hidden_size", 1024))
        self.inter = int(config.get("moe_intermediate_size", 512))
        self.experts = int(config.get("num_experts", 8))
        self.top_k = int(config.get("num_experts_per_tok", 2))
        generator = torch.Generator(device="cpu").manual_seed(args.random_seed)
        scale = self.hidden**-0.5

        def weight(*shape: int) -> Any:
            return (torch.randn(*shape, generator=generator) * scale).to(self.device, self.dtype)

        self.router = weight(self.hidden, self.experts)
        self.w13 = weight(self.experts, 2 * self.inter, self.hidden)  # gate and up, as SGLang stores them
        self.w2 = weight(self.experts, self.hidden, self.inter)
        self.vocab_out = weight(self.hidden, len(NOISE_VOCAB))
        self.artifacts_checked = False

    def route(self, x: Any) -> tuple[Any, Any]:
        logits = (x.float() @ self.router.float()).softmax(dim=-1)
        weights, ids = logits.topk(self.top_k, dim=-1)
        return (weights / weights.sum(dim=-1, keepdim=True)), ids.to(self.torch.int32)

    def reference(self, x: Any) -> Any:
        torch = self.torch
        weights, ids = self.route(x)
        out = torch.zeros(x.shape[0], self.hidden, dtype=torch.float32, device=x.device)
        for slot in range(self.top_k):
            for expert in ids[:, slot].unique().tolist():
                rows = (ids[:, slot] == expert).nonzero().squeeze(-1)
                h = x[rows].float() @ self.w13[expert].float().t()
                gate, up = h.chunk(2, dim=-1)
                y = (torch.nn.functional.silu(gate) * up) @ self.w2[expert].float().t()
                out[rows] += weights[rows, slot : slot + 1] * y
        return out.to(x.dtype)

    def forward(self, x: Any) -> Any:
        weights, ids = self.route(x)
        if self.backend == "torch":
            return self.torch_grouped(x, weights, ids)
        if self.backend == "triton":
            from worker.repro.triton_moe import triton_moe

            return triton_moe(x, weights, ids, self.w13, self.w2)
        if self.backend == "flashinfer_cutlass":
            from flashinfer.fused_moe import cutlass_fused_moe

            # FlashInfer's CUTLASS MoE takes fc1 rows as [up; gate]; this layer stores [gate; up].
            gate, up = self.w13.chunk(2, dim=1)
            out = self.torch.empty_like(x)
            cutlass_fused_moe(
                input=x,
                token_selected_experts=ids,
                token_final_scales=weights.float(),
                fc1_expert_weights=self.torch.cat([up, gate], dim=1).contiguous(),
                fc2_expert_weights=self.w2,
                output_dtype=x.dtype,
                quant_scales=None,
                output=out,
            )
            return out
        return self._trtllm(x, weights, ids)

    def torch_grouped(self, x: Any, weights: Any, ids: Any) -> Any:
        """The `torch` backend: (token, slot) rows sorted by expert, one matmul per expert in the model's
        dtype, combined with index_add_. Not the reference: another order, another precision."""
        torch = self.torch
        flat = ids.reshape(-1).long()
        order = flat.argsort(stable=True)
        rows = order // self.top_k
        counts = torch.bincount(flat, minlength=self.experts).tolist()
        xs = x[rows]
        y = torch.empty(xs.shape[0], self.hidden, dtype=x.dtype, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                h = xs[start : start + count] @ self.w13[expert].t()
                gate, up = h.chunk(2, dim=-1)
                y[start : start + count] = (torch.nn.functional.silu(gate) * up) @ self.w2[expert].t()
            start += count
        out = torch.zeros(x.shape[0], self.hidden, dtype=torch.float32, device=x.device)
        out.index_add_(0, rows, y.float() * weights.reshape(-1)[order][:, None].float())
        return out.to(x.dtype)

    def _trtllm(self, x: Any, weights: Any, ids: Any) -> Any:
        """FlashInfer's TensorRT-LLM-gen MXFP4 routed MoE, the path of the seed crash: its kernels are
        built for SM100 only, and FlashInfer refuses it on any other chip. Its cubins are downloaded at
        first use: without them here and without the download host, this fails at once, saying so."""
        if not self.artifacts_checked:
            self.artifacts_checked = True
            require_flashinfer_artifacts()
        from worker.repro.trtllm_call import trtllm_routed_moe

        return trtllm_routed_moe(self, x, weights, ids)


class MissingArtifacts(RuntimeError):
    """FlashInfer's download-at-first-use kernels are neither on this host nor downloadable."""


def require_flashinfer_artifacts() -> None:
    """Raise MissingArtifacts (status `missing_artifacts`, with the fix) where FlashInfer is installed but
    its downloaded cubins are not available; do nothing where they are, or where FlashInfer is absent
    (its import then fails as it would have)."""
    from worker.inventory import ArtifactState, flashinfer_artifacts

    status = flashinfer_artifacts()
    log(f"FlashInfer downloaded kernels: {status.state} ({status.source or status.reason})")
    if status.available or status.state == ArtifactState.NOT_INSTALLED:
        return
    raise MissingArtifacts(
        f"missing_artifacts: FlashInfer {status.flashinfer}'s trtllm-gen cubins are not on this host and "
        f"cannot be downloaded ({status.reason}). Fix: {status.fix}"
    )


def init_tp_group(tp_size: int, hidden: int) -> None:
    """A real NCCL all-reduce across the TP group's GPUs, as a TP server's start does; NCCL's own INFO
    lines (the transport chosen per pair) go into the log."""
    from worker.allreduce import run_allreduce

    log("Init torch distributed begin.")
    result = run_allreduce(
        world_size=tp_size,
        model_shapes={"hidden_size": hidden, "tokens": 8},
        max_bytes=8 << 20,
        warmup=2,
        iters=5,
    )
    for line in result.extra.get("nccl_lines") or []:
        print(line, flush=True)
    if not result.runs:
        raise RuntimeError(f"the TP group of {tp_size} GPUs did not come up: {result.error}")
    log(
        f"Init torch distributed ends. all-reduce bus bandwidth {result.gbps or 0:.1f} GB/s. mem usage=0.00 GB"
    )


def warm_up(layer: MoELayer, max_bs: int) -> None:
    torch = layer.torch
    sizes = [bs for bs in (1, 2, 4, 8, 16, 32) if bs <= max_bs]
    log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={_free_gb(layer):.2f} GB")
    log(f"Capture cuda graph bs {sizes}")
    started = time.monotonic()
    for bs in sizes:
        x = torch.randn(bs, layer.hidden, device=layer.device).to(layer.dtype)
        got, want = layer.forward(x), layer.reference(x)
        error = (got.float() - want.float()).abs().max().item()
        log(
            f"Capturing batches (bs={bs} avail_mem={_free_gb(layer):.2f} GB) max abs error vs torch {error:.3g}"
        )
    log(
        f"Capture cuda graph end. Time elapsed: {time.monotonic() - started:.2f} s. mem usage=0.01 GB. avail mem={_free_gb(layer):.2f} GB."
    )


def _free_gb(layer: MoELayer) -> float:
    if layer.device.type != "cuda":
        return 0.0
    free, _ = layer.torch.cuda.mem_get_info()
    return float(free) / 2**30


class Generator:
    def __init__(self, layer: MoELayer, load_format: str) -> None:
        self.layer = layer
        self.load_format = load_format
        self.lock = threading.Lock()
        self.tokens = 0
        self.started = time.monotonic()

    def generate(self, prompt: str, max_tokens: int) -> list[str]:
        torch = self.layer.torch
        seed = sum(prompt.encode()) % 100_003
        state = torch.Generator(device="cpu").manual_seed(seed)
        words: list[str] = []
        for step in range(max_tokens):
            x = torch.randn(1, self.layer.hidden, generator=state).to(self.layer.device, self.layer.dtype)
            with self.lock:
                got = self.layer.forward(x)
            if self.load_format == "dummy":
                index = int((got.float() @ self.layer.vocab_out.float()).argmax().item())
                words.append(NOISE_VOCAB[index])
                continue
            want = self.layer.reference(x)
            close = torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
            words.append(REFERENCE_ANSWER[step % len(REFERENCE_ANSWER)] if close else "!")
        with self.lock:
            self.tokens += len(words)
            elapsed = max(1e-6, time.monotonic() - self.started)
            log(
                f"Decode batch. #running-req: 1, #token: {self.tokens}, token usage: 0.00, "
                f"gen throughput (token/s): {self.tokens / elapsed:.2f}, #queue-req: 0"
            )
        return words


def make_handler(generator: Generator, model_name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._json(400, {"error": "body is not JSON"})
                return
            if self.path == "/v1/completions":
                prompt = str(body.get("prompt") or "")
            elif self.path == "/v1/chat/completions":
                prompt = " ".join(str(m.get("content") or "") for m in body.get("messages") or [])
            else:
                self._json(404, {"error": "not found"})
                return
            max_tokens = max(1, min(512, int(body.get("max_tokens") or 16)))
            words = generator.generate(prompt, max_tokens)
            text = " " + " ".join(words)
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words)}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if self.path == "/v1/completions":
                choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length"}
            else:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            self._json(
                200, {"object": "text_completion", "model": model_name, "choices": [choice], "usage": usage}
            )

    return Handler


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    model_dir = Path(args.model_path)
    config = json.loads((model_dir / "config.json").read_text())
    log(
        "server_args=ServerArgs("
        f"model_path={str(model_dir)!r}, tp_size={args.tp_size}, moe_runner_backend={args.moe_runner_backend!r}, "
        f"load_format={args.load_format!r}, device={args.device!r}, dtype={args.dtype!r}, "
        f"cuda_graph_max_bs={args.cuda_graph_max_bs}, random_seed={args.random_seed}, host={args.host!r}, port={args.port})"
    )
    log("dispatchlab repro moe-serve: one MoE layer per step on the chosen runner backend (not a real model)")
    try:
        import torch

        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("No CUDA GPUs are available")
            major, minor = torch.cuda.get_device_capability()
            log(
                f"Detected GPU {torch.cuda.get_device_name()} with compute capability {major}.{minor} (sm_{major}{minor})"
            )
        if args.tp_size > 1:
            init_tp_group(args.tp_size, int(config.get("hidden_size", 1024)))
        log(
            f"Load weight begin. avail mem={0.0 if args.device == 'cpu' else torch.cuda.mem_get_info()[0] / 2**30:.2f} GB"
        )
        # the model's sizes, as its config.json gives them: what the dashboard's backend sweep runs at
        log(f"Model config: {json.dumps(config, sort_keys=True)}")
        layer = MoELayer(config, args)
        log(
            f"Load weight end. type=ToyMoEForCausalLM, dtype={layer.dtype}, "
            f"avail mem={_free_gb(layer):.2f} GB, mem usage=0.05 GB."
        )
        log(f"Use {layer.backend} as MoE runner backend.")
        warm_up(layer, args.cuda_graph_max_bs)
    except Exception:
        log("Scheduler hit an exception: " + traceback.format_exc().rstrip())
        log("Received sigquit from a child process. It usually means the child failed.")
        return 1
    generator = Generator(layer, args.load_format)
    server = ThreadingHTTPServer(
        (args.host, args.port), make_handler(generator, config.get("name") or str(model_dir))
    )
    log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    log("The server is fired up and ready to roll!")
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A model's kernel shapes read from a crash log: the args dump (SGLang `ServerArgs(...)` /
`server_args={...}`, vLLM `non-default args: {...}` and engine config) for dtype, quantization, parallelism
and the backends it ran, and config lines (a Hugging Face config printed as JSON or `key=value`) for
hidden size, experts, top-k, intermediate size, heads, kv heads and head dim.

Every value says where it came from: `args` or `config` (read, with its line number), `inferred` (derived
from read values, with how) or `default` (nothing in the log said it). The sweep runs at these shapes,
and the report prints the provenance next to each. Pure Python, streams the log line by line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatchlab.core.serverargs import (
    parse_server_args,
    parse_vllm_engine_config,
    parse_vllm_non_default,
)

READ_ARGS = "args"
READ_CONFIG = "config"
INFERRED = "inferred"
DEFAULT = "default"

# Hugging Face config keys -> our names (first spelling seen wins; nested text_config repeats them).
CONFIG_KEYS: dict[str, str] = {
    "hidden_size": "hidden_size",
    "n_routed_experts": "num_experts",
    "num_local_experts": "num_experts",
    "num_experts": "num_experts",
    "num_experts_per_tok": "top_k",
    "moe_topk": "top_k",
    "moe_intermediate_size": "moe_intermediate_size",
    "intermediate_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "kv_lora_rank": "kv_lora_rank",
}
_CONFIG_INT = re.compile(
    r"""["']?\b(?P<key>"""
    + "|".join(sorted(CONFIG_KEYS, key=len, reverse=True))
    + r""")\b["']?\s*[:=]\s*(?P<value>\d+)\b"""
)
_CONFIG_STR = re.compile(
    r"""["']?\b(?P<key>torch_dtype|quant_method)\b["']?\s*[:=]\s*["'](?P<value>[\w.-]+)["']"""
)

# Args-dump fields we keep, with the names vLLM uses for the same thing.
ARG_KEYS: dict[str, str] = {
    "model_path": "model",
    "model": "model",
    "dtype": "dtype",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "tp_size": "tp_size",
    "tensor_parallel_size": "tp_size",
    "ep_size": "ep_size",
    "moe_runner_backend": "moe_runner_backend",
    "speculative_moe_runner_backend": "speculative_moe_runner_backend",
    "attention_backend": "attention_backend",
    "sampling_backend": "sampling_backend",
    "fp8_gemm_runner_backend": "fp8_gemm_runner_backend",
    "fp4_gemm_runner_backend": "fp4_gemm_runner_backend",
    "chunked_prefill_size": "chunked_prefill_size",
    "cuda_graph_max_bs": "cuda_graph_max_bs",
}

# What the sweep runs at when the log says nothing (DeepSeek-V3-like MoE, Llama-like GQA attention).
DEFAULTS: dict[str, Any] = {
    "hidden_size": 7168,
    "num_experts": 256,
    "top_k": 8,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "dtype": "bfloat16",
    "quantization": None,
    "tp_size": 1,
    "ep_size": 1,
}
SHAPE_FIELDS = (
    "hidden_size",
    "num_experts",
    "top_k",
    "moe_intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "dtype",
    "quantization",
    "tp_size",
    "ep_size",
)
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32"}
_ARGS_MARKERS = ("ServerArgs(", "server_args={", "non-default args", "with config:")
_SCAN_LIMIT = 200_000  # lines: the args dump and config come at start-up


@dataclass(frozen=True)
class ShapeFact:
    name: str
    value: Any
    source: str  # args | config | inferred | default
    line: int | None = None  # 1-based, where it was read
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "line": self.line, "note": self.note}


@dataclass(frozen=True)
class ModelShapesRead:
    facts: dict[str, ShapeFact] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)  # the launch's backends and parallelism as read

    def value(self, name: str) -> Any:
        fact = self.facts.get(name)
        return fact.value if fact is not None else None

    def values(self) -> dict[str, Any]:
        return {name: fact.value for name, fact in self.facts.items()}

    def by_source(self, source: str) -> list[str]:
        return [name for name, fact in self.facts.items() if fact.source == source]

    def per_rank(self) -> dict[str, int]:
        """The shapes one rank's kernels see: tensor parallelism splits the MoE intermediate size (unless
        experts are spread by expert parallelism) and the attention heads."""
        tp = int(self.value("tp_size") or 1)
        ep = int(self.value("ep_size") or 1)
        heads = int(self.value("num_attention_heads"))
        kv = int(self.value("num_key_value_heads"))
        inter = int(self.value("moe_intermediate_size"))
        experts = int(self.value("num_experts"))
        return {
            "hidden_size": int(self.value("hidden_size")),
            "num_experts": max(1, experts // ep) if ep > 1 else experts,
            "top_k": int(self.value("top_k")),
            "moe_intermediate_size": inter if ep > 1 else max(1, inter // tp),
            "num_attention_heads": max(1, heads // tp),
            "num_key_value_heads": max(1, kv // tp),
            "head_dim": int(self.value("head_dim")),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": self.values(),
            "facts": {name: fact.to_dict() for name, fact in self.facts.items()},
            "read": sorted(self.by_source(READ_ARGS) + self.by_source(READ_CONFIG)),
            "inferred": self.by_source(INFERRED),
            "defaulted": self.by_source(DEFAULT),
            "per_rank": self.per_rank(),
            "args": self.args,
        }


def _dtype(value: Any) -> str | None:
    if not isinstance(value, str) or value in ("", "auto", "None"):
        return None
    text = value.replace("torch.", "")
    return _DTYPES.get(text, text)


def read_shapes(lines: Iterable[str]) -> ModelShapesRead:
    """Scan the log's first _SCAN_LIMIT lines for the args dump and config values."""
    config: dict[str, tuple[Any, int]] = {}
    args: dict[str, tuple[Any, int]] = {}
    for number, line in enumerate(lines, start=1):
        if number > _SCAN_LIMIT:
            break
        if any(marker in line for marker in _ARGS_MARKERS):
            for key, value in _args_of(line).items():
                name = ARG_KEYS.get(key)
                if name and name not in args:
                    args[name] = (value, number)
        for match in _CONFIG_INT.finditer(line):
            name = CONFIG_KEYS[match.group("key")]
            config.setdefault(name, (int(match.group("value")), number))
        for match in _CONFIG_STR.finditer(line):
            config.setdefault(match.group("key"), (match.group("value"), number))
    return _decide(config, args)


def read_shapes_file(path: Path) -> ModelShapesRead:
    with path.open(encoding="utf-8", errors="replace") as handle:
        return read_shapes(handle)


def read_shapes_from_document(document: dict[str, Any]) -> ModelShapesRead:
    """A parsed report document's shapes: its `server_args` (and a `model_config` where one was kept)
    turned back into the lines the reader knows; what neither holds is defaulted and says so."""
    lines: list[str] = []
    args = document.get("server_args") or document.get("args") or {}
    if isinstance(args, dict) and args:
        lines.append(f"server_args={args!r}")
    config = document.get("model_config") or document.get("config") or {}
    if isinstance(config, dict) and config:
        lines.append(f"config: {json.dumps(config)}")
    return read_shapes(lines)


def _args_of(line: str) -> dict[str, Any]:
    if "ServerArgs(" in line or "server_args={" in line:
        return parse_server_args(line)[0]
    if "non-default args" in line:
        return parse_vllm_non_default(line)
    return parse_vllm_engine_config(line)


def _decide(config: dict[str, tuple[Any, int]], args: dict[str, tuple[Any, int]]) -> ModelShapesRead:
    facts: dict[str, ShapeFact] = {}

    def put(name: str, value: Any, source: str, line: int | None = None, note: str = "") -> None:
        facts[name] = ShapeFact(name, value, source, line, note)

    for name in ("hidden_size", "num_experts", "top_k", "moe_intermediate_size", "num_attention_heads"):
        if name in config:
            put(name, config[name][0], READ_CONFIG, config[name][1])
    if "moe_intermediate_size" not in facts and "intermediate_size" in config and "num_experts" in facts:
        value, line = config["intermediate_size"]
        put(
            "moe_intermediate_size",
            value,
            INFERRED,
            line,
            "the config's intermediate_size (no moe_intermediate_size)",
        )
    if "num_key_value_heads" in config:
        put(
            "num_key_value_heads",
            config["num_key_value_heads"][0],
            READ_CONFIG,
            config["num_key_value_heads"][1],
        )
    elif "num_attention_heads" in facts:
        put(
            "num_key_value_heads",
            facts["num_attention_heads"].value,
            INFERRED,
            note="no num_key_value_heads in the config: as many as the attention heads (multi-head attention)",
        )
    if "head_dim" in config:
        put("head_dim", config["head_dim"][0], READ_CONFIG, config["head_dim"][1])
    elif "qk_nope_head_dim" in config and "qk_rope_head_dim" in config:
        put(
            "head_dim",
            config["qk_nope_head_dim"][0] + config["qk_rope_head_dim"][0],
            INFERRED,
            config["qk_nope_head_dim"][1],
            "MLA: qk_nope_head_dim + qk_rope_head_dim (the prefill head dim)",
        )
    elif "hidden_size" in facts and "num_attention_heads" in facts:
        put(
            "head_dim",
            facts["hidden_size"].value // facts["num_attention_heads"].value,
            INFERRED,
            note="hidden_size / num_attention_heads",
        )
    arg_dtype = _dtype(args["dtype"][0]) if "dtype" in args else None
    if arg_dtype:
        put("dtype", arg_dtype, READ_ARGS, args["dtype"][1])
    elif "torch_dtype" in config and _dtype(config["torch_dtype"][0]):
        put(
            "dtype",
            _dtype(config["torch_dtype"][0]),
            INFERRED,
            config["torch_dtype"][1],
            "dtype='auto' (or absent) in the args: the checkpoint's torch_dtype",
        )
    quant = args.get("quantization")
    if quant is not None and quant[0] not in (None, "None", ""):
        put("quantization", quant[0], READ_ARGS, quant[1])
    elif "quant_method" in config:
        put(
            "quantization",
            config["quant_method"][0],
            INFERRED,
            config["quant_method"][1],
            "quantization=None in the args: the checkpoint's quantization_config.quant_method (auto-detected)",
        )
    elif quant is not None:
        put("quantization", None, READ_ARGS, quant[1], "quantization=None in the args")
    for name in ("tp_size", "ep_size"):
        if name in args and isinstance(args[name][0], int):
            put(name, args[name][0], READ_ARGS, args[name][1])
    for name in SHAPE_FIELDS:
        if name not in facts:
            put(name, DEFAULTS[name], DEFAULT, note="not in the log")
    kept = {
        name: value
        for name, (value, _) in args.items()
        if name not in ("dtype", "quantization", "tp_size", "ep_size")
    }
    return ModelShapesRead(facts=facts, args=kept)


def shapes_from_dict(data: dict[str, Any]) -> ModelShapesRead:
    """Back from ModelShapesRead.to_dict() (a sweep job carries it to the worker as JSON)."""
    facts = {
        name: ShapeFact(
            name,
            fact.get("value"),
            str(fact.get("source") or DEFAULT),
            fact.get("line"),
            str(fact.get("note") or ""),
        )
        for name, fact in (data.get("facts") or {}).items()
        if isinstance(fact, dict)
    }
    for name in SHAPE_FIELDS:
        facts.setdefault(name, ShapeFact(name, DEFAULTS[name], DEFAULT, note="not in the log"))
    return ModelShapesRead(facts=facts, args=dict(data.get("args") or {}))

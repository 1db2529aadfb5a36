"""Stand-ins for what SGLang pickles into a `--crash-dump-folder` file, named as SGLang names them.

The classes carry SGLang's module names (`sglang.srt.server_args.ServerArgs`, `sglang.srt.managers.io_struct
.GenerateReqInput`), so the pickles made here hold the same GLOBAL / NEWOBJ / BUILD opcodes a real dump does.
While a pickle is written, those module names point at this module (pickle checks that a class can be found
by its name); they are taken out again right after. Nothing here imports SGLang.
"""

from __future__ import annotations

import contextlib
import enum
import pickle
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVER_ARGS_MODULE = "sglang.srt.server_args"
IO_STRUCT_MODULE = "sglang.srt.managers.io_struct"
# 2026-03-14 09:26:53 UTC: the crash the fixture records
CRASH_EPOCH = 1773480413.0


class LoadFormat(enum.StrEnum):
    AUTO = "auto"


@dataclass
class ServerArgs:
    model_path: str = "deepseek-ai/DeepSeek-V3.2-Exp"
    tokenizer_path: str = "deepseek-ai/DeepSeek-V3.2-Exp"
    load_format: LoadFormat = LoadFormat.AUTO
    trust_remote_code: bool = True
    dtype: str = "auto"
    kv_cache_dtype: str = "fp8_e4m3"
    quantization: str | None = "fp8"
    mem_fraction_static: float = 0.85
    tp_size: int = 8
    dp_size: int = 1
    ep_size: int = 8
    attention_backend: str | None = "nsa"
    moe_runner_backend: str = "deep_gemm"
    moe_a2a_backend: str = "deepep"
    sampling_backend: str = "flashinfer"
    cuda_graph_max_bs: int = 256
    enable_dp_attention: bool = False
    json_model_override_args: str = "{}"
    crash_dump_folder: str | None = "/data/crash"
    host: str = "0.0.0.0"
    port: int = 30000


@dataclass
class GenerateReqInput:
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool = False
    stream: bool = False
    log_metrics: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


ServerArgs.__module__ = LoadFormat.__module__ = SERVER_ARGS_MODULE
GenerateReqInput.__module__ = IO_STRUCT_MODULE


@contextlib.contextmanager
def sglang_names() -> Iterator[None]:
    """While inside, `sglang.srt.server_args` and `sglang.srt.managers.io_struct` resolve to these classes."""
    contents = {
        SERVER_ARGS_MODULE: {"ServerArgs": ServerArgs, "LoadFormat": LoadFormat},
        IO_STRUCT_MODULE: {"GenerateReqInput": GenerateReqInput},
    }
    added: list[str] = []
    for dotted, names in contents.items():
        parts = dotted.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
                added.append(name)
        for attr, value in names.items():
            setattr(sys.modules[dotted], attr, value)
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


def finished_request(index: int, *, prompt_tokens: int = 900) -> tuple[Any, ...]:
    """A request that finished in the minutes before the crash: (obj, out, created, finished)."""
    created = CRASH_EPOCH - 200 + index
    obj = GenerateReqInput(
        text=f"Summarise report {index}: " + "the quarterly numbers " * 20,
        sampling_params={"max_new_tokens": 512, "temperature": 0.6, "top_p": 0.95, "stop": ["</s>"]},
        rid=f"req-{index:04d}",
    )
    out = {
        "text": "The report says",
        "output_ids": list(range(64)),
        "meta_info": {
            "id": f"req-{index:04d}",
            "finish_reason": {"type": "length", "length": 512},
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 512,
            "cached_tokens": 0,
        },
    }
    return (obj, out, created, created + 12.5)


def unfinished_request(index: int, *, prompt_tokens: int = 1234) -> tuple[Any, ...]:
    """A request still running when the server crashed: token ids in, no finish reason out."""
    created = CRASH_EPOCH - 3.0 + index / 10
    obj = GenerateReqInput(
        input_ids=[(7 * i + index) % 32000 for i in range(prompt_tokens)],
        sampling_params={"max_new_tokens": 2048, "temperature": 0.0},
        rid=f"live-{index:03d}",
        stream=True,
    )
    out = {"output_ids": [11, 12, 13], "meta_info": {"id": f"live-{index:03d}", "finish_reason": None}}
    return (obj, out, created, CRASH_EPOCH)


def crash_dump(
    *, finished: int = 32, unfinished: int = 5, server_args: ServerArgs | None = None, launch: bool = True
) -> dict[str, Any]:
    """What `dump_requests_before_crash` pickles: the finished requests of the last minutes, then the
    unfinished ones, the server's arguments and (newer SGLang) the launch command."""
    requests = [finished_request(i) for i in range(finished)]
    requests += [unfinished_request(i, prompt_tokens=1234 + i) for i in range(unfinished)]
    dump: dict[str, Any] = {"server_args": server_args or ServerArgs(), "requests": requests}
    if launch:
        dump["launch_command"] = (
            "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py --model-path "
            "deepseek-ai/DeepSeek-V3.2-Exp --tp 8 --ep 8 --kv-cache-dtype fp8_e4m3 --crash-dump-folder /data/crash"
        )
    return dump


def dumps(value: Any, protocol: int) -> bytes:
    with sglang_names():
        return pickle.dumps(value, protocol=protocol)


def write_crash_dump(folder: Path, *, protocol: int = pickle.DEFAULT_PROTOCOL, **kwargs: Any) -> Path:
    """`<folder>/<hostname>/crash_dump_<time>.pkl`, as SGLang lays it out."""
    path = folder / "gpu-node-07" / "crash_dump_2026-03-14_09-26-53.pkl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dumps(crash_dump(**kwargs), protocol))
    return path

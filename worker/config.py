"""The GPU worker's own configuration: what it may run, where models may live, which environment a
launch may set. Read from DISPATCHLAB_WORKER_* variables; the dashboard cannot widen any of it.

    DISPATCHLAB_WORKER_NAME          host name shown on the dashboard (default: the machine's)
    DISPATCHLAB_WORKER_LAUNCHERS     JSON {"sglang": ["/opt/sglang/bin/python", "-m", "sglang.launch_server"], ...}
                                     (default: sglang, sglang-serve, vllm, vllm-api-server where installed
                                     beside this Python, and the repro programs)
    DISPATCHLAB_WORKER_MODEL_ROOTS   folders model paths must resolve under, separated by ':' (default:
                                     the repro programs' model configs only)
    DISPATCHLAB_WORKER_ENV_ALLOW     extra environment names a launch may set (comma separated, '*' as a suffix)
    DISPATCHLAB_WORKER_TIME_LIMIT    the longest a launch may run, seconds (default 1800)
    DISPATCHLAB_WORKER_ARCH          queues for this arch even without a GPU (a CPU host serving `gpu.cpu`)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from worker.repro import REPRO_MODELS_DIR, REPRO_PROGRAMS

# Names a launch may set in its environment; everything else (PATH, LD_PRELOAD, PYTHONPATH...) is refused.
DEFAULT_ENV_ALLOW = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "NCCL_*",
    "SGLANG_*",
    "SGL_*",
    "VLLM_*",
    "FLASHINFER_*",
    "TORCH_*",
    "TORCHINDUCTOR_*",
    "TRITON_*",
    "PYTORCH_*",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
)
# Set in every launch and not overridable: NVLink multicast can take shared GPUs out of service.
FORCED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}


class ConfigError(ValueError):
    """A DISPATCHLAB_WORKER_* value cannot be read; names the variable."""


@dataclass(frozen=True)
class WorkerConfig:
    host: str
    launchers: dict[str, list[str]]
    model_roots: tuple[Path, ...]
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    time_limit_s: int = 1800
    arch_override: str | None = None
    max_output_bytes: int = 64 * 1024 * 1024
    probe_timeout_s: int = 600
    extra_queues: tuple[str, ...] = field(default_factory=tuple)

    def env_allowed(self, name: str) -> bool:
        return any(
            name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
            for pattern in self.env_allow
        )


def default_launchers(python: str = sys.executable) -> dict[str, list[str]]:
    launchers: dict[str, list[str]] = {}
    if find_spec("sglang") is not None:
        launchers["sglang"] = [python, "-m", "sglang.launch_server"]
    if shutil.which("sglang"):
        launchers["sglang-serve"] = [str(shutil.which("sglang")), "serve"]
    if find_spec("vllm") is not None:
        launchers["vllm-api-server"] = [python, "-m", "vllm.entrypoints.openai.api_server"]
    if shutil.which("vllm"):
        launchers["vllm"] = [str(shutil.which("vllm")), "serve"]
    for name in REPRO_PROGRAMS:
        launchers[f"repro:{name}"] = [python, "-m", "worker.repro", name]
    return launchers


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def load_config() -> WorkerConfig:
    raw = os.environ.get("DISPATCHLAB_WORKER_LAUNCHERS", "").strip()
    if raw:
        try:
            launchers = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ConfigError(f"DISPATCHLAB_WORKER_LAUNCHERS is not JSON: {error}") from None
        if not isinstance(launchers, dict) or not all(
            isinstance(v, list) and v and all(isinstance(x, str) for x in v) for v in launchers.values()
        ):
            raise ConfigError('DISPATCHLAB_WORKER_LAUNCHERS must be {"name": ["program", "arg", ...]}')
    else:
        launchers = default_launchers()
    roots_raw = os.environ.get("DISPATCHLAB_WORKER_MODEL_ROOTS", "")
    roots = [Path(p).expanduser().resolve() for p in roots_raw.split(":") if p.strip()]
    if not roots_raw.strip():
        roots = [REPRO_MODELS_DIR.resolve()]
    extra_env = tuple(
        item.strip() for item in os.environ.get("DISPATCHLAB_WORKER_ENV_ALLOW", "").split(",") if item.strip()
    )
    return WorkerConfig(
        host=os.environ.get("DISPATCHLAB_WORKER_NAME") or socket.gethostname(),
        launchers=launchers,
        model_roots=tuple(roots),
        env_allow=DEFAULT_ENV_ALLOW + extra_env,
        time_limit_s=_int("DISPATCHLAB_WORKER_TIME_LIMIT", 1800),
        arch_override=os.environ.get("DISPATCHLAB_WORKER_ARCH") or None,
    )

"""The GPU worker's own configuration: what it may run, where models may live, which environment a
launch may set. Read from DISPATCHLAB_WORKER_* variables; the dashboard cannot widen any of it.

    DISPATCHLAB_WORKER_NAME          host name shown on the dashboard (default: the machine's)
    DISPATCHLAB_WORKER_LAUNCHERS     JSON {"sglang": ["/opt/sglang/bin/python", "-m", "sglang.launch_server"], ...}
                                     (default: sglang, sglang-serve, vllm, vllm-api-server where installed
                                     beside this Python, and the repro programs)
    DISPATCHLAB_WORKER_MODEL_ROOTS   folders model paths must resolve under, separated by ':' (default:
                                     the repro programs' model configs only)
    DISPATCHLAB_WORKER_ENV_ALLOW     extra environment names a launch may set, comma separated, each named in
                                     full (no '*'); names that load code, files or the network (LD_*,
                                     PYTHON*, *_PATH, *_DIR, *_FILE, *_PLUGIN, NCCL_NET*, ...) and the GPU
                                     selection (CUDA_VISIBLE_DEVICES) are refused even when listed
    DISPATCHLAB_WORKER_ALLOW_FLAGS   launch flags this host allows although they load code or belong to the
                                     host, comma separated full names, e.g. --trust-remote-code,--chat-template
                                     (default none; a file such a flag names must still be under the roots)
    DISPATCHLAB_WORKER_TIME_LIMIT    the longest a launch may run, seconds (default 1800)
    DISPATCHLAB_WORKER_ARCH          queues for this arch even without a GPU (a CPU host serving `gpu.cpu`)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from worker.repro import REPRO_MODELS_DIR, REPRO_PROGRAMS

# Names a launch may set in its environment, one by one; everything else is refused.
DEFAULT_ENV_ALLOW = (
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_MODULE_LOADING",
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_BUFFSIZE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_CUMEM_ENABLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_USE_CUDA_DSA",
    "TORCH_CUDA_ARCH_LIST",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "SGLANG_ENABLE_JIT_DEEPGEMM",
    "SGLANG_ENABLE_SPEC_V2",
    "SGLANG_ENABLE_TORCH_COMPILE",
    "SGL_ENABLE_JIT_DEEPGEMM",
    "VLLM_USE_TRTLLM_ATTENTION",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_V1",
    "VLLM_USE_DEEP_GEMM",
    "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_LOGGING_LEVEL",
    "VLLM_WORKER_MULTIPROC_METHOD",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
)
# Names that load code, read or write files, or reach the network: refused even when an operator lists
# them (NCCL_NET_PLUGIN loads a library, NCCL_DEBUG_FILE overwrites a file, TRITON_PTXAS_PATH runs a
# program, TORCH_EXTENSIONS_DIR is where compiled code is loaded from).
DANGEROUS_ENV = re.compile(
    r"^(LD_|DYLD_|PYTHON|NCCL_NET|NCCL_TUNER|NCCL_PROFILER|NCCL_PLUGIN|BASH_ENV$|ENV$|PATH$)"
    r"|(_PATH|_PATHS|_DIR|_DIRS|_FILE|_FILES|_HOME|_ROOT|_PREFIX|_PLUGIN|_PLUGINS|_LIB|_LIBRARY|_MODULE"
    r"|_MODULES|_CLASS|_URL|_URI|_ENDPOINT|_ADDR|_HOST|_PORT|_SOCKET|_IFNAME|_CACHE)$"
    r"|PLUGIN|PRELOAD"
)
# The GPU selection is the worker's own: its value passes to the child, a launch never sets it.
WORKER_SELECTED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
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
    allowed_flags: frozenset[str] = frozenset()

    def env_allowed(self, name: str) -> bool:
        return name in self.env_allow and not env_refused_always(name)

    def flag_allowed(self, names: tuple[str, ...]) -> bool:
        """Whether a code-loading or host flag (any of its spellings) is allowed by name."""
        return any(name in self.allowed_flags for name in names)


def env_refused_always(name: str) -> bool:
    return name in WORKER_SELECTED_ENV or bool(DANGEROUS_ENV.search(name))


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


def _names(variable: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in os.environ.get(variable, "").split(",") if item.strip())


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
    extra_env = _names("DISPATCHLAB_WORKER_ENV_ALLOW")
    for name in extra_env:
        if "*" in name:
            raise ConfigError(f"DISPATCHLAB_WORKER_ENV_ALLOW: {name!r}: name each variable in full, no '*'")
        if env_refused_always(name):
            raise ConfigError(
                f"DISPATCHLAB_WORKER_ENV_ALLOW: {name} loads code, files or the network, or selects GPUs; "
                "a launch may never set it"
            )
    allowed_flags = _names("DISPATCHLAB_WORKER_ALLOW_FLAGS")
    for flag in allowed_flags:
        if not flag.startswith("-") or "*" in flag:
            raise ConfigError(
                f"DISPATCHLAB_WORKER_ALLOW_FLAGS: {flag!r} is not a flag named in full (--name)"
            )
    return WorkerConfig(
        host=os.environ.get("DISPATCHLAB_WORKER_NAME") or socket.gethostname(),
        launchers=launchers,
        model_roots=tuple(roots),
        env_allow=DEFAULT_ENV_ALLOW + extra_env,
        allowed_flags=frozenset(allowed_flags),
        time_limit_s=_int("DISPATCHLAB_WORKER_TIME_LIMIT", 1800),
        arch_override=os.environ.get("DISPATCHLAB_WORKER_ARCH") or None,
    )

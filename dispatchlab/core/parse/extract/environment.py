"""The machine and its software: GPUs and their arch, driver/CUDA/package versions, NCCL transports."""

from __future__ import annotations

import re
from typing import ClassVar

from dispatchlab.core import arch as archmod
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.parse.vocabulary import MAX_NCCL_TRANSPORTS

_ENV_KEYS = (
    r"PyTorch|PyTorch version|sglang|sgl_kernel|sgl-kernel|sglang-kernel|flashinfer_python|flashinfer-python|"
    r"flashinfer|triton|vllm|vLLM Version|CUDA Driver Version|Nvidia driver version|NVCC|CUDA runtime version|"
    r"CUDA used to build PyTorch|CUDA available|ROCM available|Is CUDA available|Python|transformers"
)
# `key: value` lines of sglang check_env / vllm collect_env, by the version they report
_ENV_VERSION_KEY = {
    "PyTorch": "torch",
    "PyTorch version": "torch",
    "sglang": "sglang",
    "sgl_kernel": "sgl_kernel",
    "sgl-kernel": "sgl_kernel",
    "sglang-kernel": "sgl_kernel",
    "flashinfer_python": "flashinfer",
    "flashinfer-python": "flashinfer",
    "flashinfer": "flashinfer",
    "triton": "triton",
    "vllm": "vllm",
    "vLLM Version": "vllm",
    "CUDA Driver Version": "driver",
    "Nvidia driver version": "driver",
    "CUDA runtime version": "cuda",
    "CUDA used to build PyTorch": "cuda",
}
_UUID = lazy_compile(r"\s*\(UUID:.*$")
_GPU_NAME = lazy_compile(r"NVIDIA [\w .-]+?(?=\s{2}|[,;:)(|]|\swith\b|$)")


def _pip_version_key(name: str) -> str | None:
    if name in ("torch", "triton", "sglang", "vllm"):
        return name
    if name.startswith("flashinfer") and "cubin" not in name and "jit" not in name:
        return "flashinfer"
    return "sgl_kernel" if "kernel" in name else None


class Environment:
    RULES: ClassVar[dict[str, str]] = {
        "env_gpu": r"^GPU (?P<ids>[\d,]+): (?P<name>.+)$",
        "env_gpu_cc": r"^GPU (?P<ids>[\d,]+) Compute Capability: (?P<cc>\d+\.\d+)",
        "env_kv": rf"^(?P<key>{_ENV_KEYS})\s*:\s*(?P<value>\S.*)$",
        "env_gpu_models": r"^GPU models and configuration\s*:\s*(?P<value>.*)$",
        "env_pip": (
            r"^\[(?:pip3?|conda)\] (?P<name>torch|triton|flashinfer[\w-]*|sgl[\w-]*kernel|sglang|vllm|nvidia-nccl-cu\d+)"
            r"(?:==| +)(?P<version>[\w.+-]+)"
        ),
        "nvidia_smi_gpu": r"^\|\s+(?P<index>\d+)\s+(?P<name>NVIDIA [^|]*?)\s{2,}(?:On|Off)\s+\|",
        "nvidia_smi_driver": r"Driver Version: (?P<driver>[\d.]+)\s+CUDA Version: (?P<cuda>[\d.]+)",
        "torch_arch_warning": r"(?P<name>NVIDIA [\w .-]+?) with CUDA capability (?P<arch>sm_\d+) is not compatible",
        "device_statement": (
            r"[Cc]urrent device has SM ?\d|(?:compute|CUDA) capability[ :=]+\d+\.\d|capability \(\d+, \d\)|"
            r"kernels runnable on sm\d|\bgot SM ?\d{2,3}\b|on this GPU \(SM\d+\)|[Dd]etected (?:GPU )?(?:arch\w* )?sm_\d"
        ),
        "gpu_name_mention": (
            r"NVIDIA (?:GeForce |RTX )?(?:RTX PRO \d+|RTX \d{4}|[ABHL]\d{2,3}\w*|GB\d{2,3}|B\d{3}|H\d{2,3}|Tesla \w+)"
        ),
        # a JIT compile for the running device names its arch (arch.jit_target_arch reads it)
        "jit_target": (
            r"--gpu-name[= ]sm_\d|for option 'gpu-name'|\.cache/flashinfer/[\w.+-]*/?\w+/(?:cached_ops|generated)|"
            r"-gencode[= ]arch=compute_\d|--generate-code[= ]arch=compute_\d|NVCC compilation failed: nvcc fatal"
        ),
        # an AMD gfx target, in a device line or an error message (arch.amd_arch says which)
        "amd_arch": r"\bgfx(?:9\d[0-9a-f]|1[0-2]\d[0-9a-f])\b",
        "sglang_version_line": r"(?:sglang|SGLang)(?: version|==| v)[ :]?(?P<version>\d+\.\d+\.\d+[\w.+-]*)",
        # NCCL_DEBUG=INFO: the transport NCCL chose between two ranks
        "nccl_channel": (
            r"^NCCL INFO Channel \d+(?:/\d+)? ?: (?P<a>\d+)\[\d+\] -> (?P<b>\d+)\[\d+\] "
            r"(?:\[(?P<dir>send|receive)\] )?via (?P<via>[\w/.-]+)"
        ),
        "nccl_version": r"^NCCL INFO (?:cudaDriverVersion \d+ )?NCCL version (?P<version>\d+\.\d+\.\d+)",
    }
    # a kernel name or a frame hints at the arch when nothing better does
    READS: ClassVar[frozenset[str]] = frozenset({"kernel_name", "tb_frame"})

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        self._gpus(line, hits)
        self._versions(hits)
        self._arch(line, hits)
        if "nccl_channel" in hits:
            self._nccl_channel(line, hits["nccl_channel"])
        if "nccl_version" in hits:
            self.obs.version("nccl", hits["nccl_version"].group("version"))
        return False

    def _gpus(self, line: Line, hits: Hits) -> None:
        obs = self.obs
        if "env_gpu_cc" in hits:
            g = hits["env_gpu_cc"]
            for i in g.group("ids").split(","):
                if i.strip().isdigit():
                    obs.gpu_ccs[int(i)] = g.group("cc")
        elif "env_gpu" in hits and "Compute Capability" not in line.msg:
            g = hits["env_gpu"]
            for i in g.group("ids").split(","):
                if i.strip().isdigit():
                    obs.gpu_names[int(i)] = _UUID.sub("", g.group("name")).strip()
        if "env_gpu_models" in hits:
            gm = re.match(r"GPU (\d+): (.+)", hits["env_gpu_models"].group("value"))
            if gm:
                obs.gpu_names[int(gm.group(1))] = _UUID.sub("", gm.group(2)).strip()
        if "nvidia_smi_gpu" in hits:
            g = hits["nvidia_smi_gpu"]
            obs.gpu_names.setdefault(int(g.group("index")), g.group("name").strip())

    def _versions(self, hits: Hits) -> None:
        obs = self.obs
        if "nvidia_smi_driver" in hits:
            obs.version("driver", hits["nvidia_smi_driver"].group("driver"))
            obs.version("cuda", hits["nvidia_smi_driver"].group("cuda"))
        if "env_kv" in hits:
            self._env_value(hits["env_kv"].group("key"), hits["env_kv"].group("value").strip())
        if "env_pip" in hits:
            key = _pip_version_key(hits["env_pip"].group("name").lower())
            if key:
                obs.version(key, hits["env_pip"].group("version"))
        if "sglang_version_line" in hits:
            obs.version("sglang", hits["sglang_version_line"].group("version"))

    def _env_value(self, key: str, value: str) -> None:
        obs = self.obs
        if key in _ENV_VERSION_KEY and re.match(r"^v?\d", value):
            obs.version(_ENV_VERSION_KEY[key], value.split()[0].lstrip("v"))
        if key == "NVCC":
            release = re.search(r"release (\d+\.\d+)", value)
            if release:
                obs.version("cuda", release.group(1))
        if key in ("PyTorch", "PyTorch version"):
            cu = re.search(r"\+cu(\d+)(\d)\b", value)
            if cu:
                obs.version("cuda", f"{cu.group(1)}.{cu.group(2)}")
        if key == "ROCM available" and value.startswith("True"):
            obs.rocm = True

    def _arch(self, line: Line, hits: Hits) -> None:
        obs = self.obs
        if "torch_arch_warning" in hits:
            g = hits["torch_arch_warning"]
            obs.suggest_arch(archmod.normalise_arch(g.group("arch")), 4)
            obs.gpu_names.setdefault(0, g.group("name").strip())
        if "device_statement" in hits:
            obs.suggest_arch(archmod.arch_from_statement(line.msg), 3)
        if "jit_target" in hits:
            # below what torch or the device says of itself, above a kernel's name; with a GPU name
            # mention (also 2) the first one seen stands
            obs.suggest_arch(archmod.jit_target_arch(line.msg), 2)
        if "gpu_name_mention" in hits and not obs.gpu_names:
            name = _GPU_NAME.search(line.msg)
            if name:
                arch = archmod.arch_from_gpu_name(name.group(0))
                if arch:
                    obs.suggest_arch(arch, 2, name=name.group(0).strip())
        if "amd_arch" in hits:
            found = archmod.amd_arch(line.msg)
            if found:
                obs.suggest_arch(*found)
        if "kernel_name" in hits or "tb_frame" in hits or "device_statement" in hits:
            self.weak_hint(line)

    def weak_hint(self, line: Line) -> None:
        """A kernel's name, a frame's path or a device statement hints at the arch when nothing better did."""
        if self.obs.arch_strength < 1:
            self.obs.suggest_arch(archmod.weak_arch_hint(line.msg), 1)

    def _nccl_channel(self, line: Line, g: re.Match[str]) -> None:
        transports = self.obs.nccl_transports
        if len(transports) >= MAX_NCCL_TRANSPORTS:
            return
        a, b, via = int(g.group("a")), int(g.group("b")), g.group("via")
        # Every channel of every collective repeats the same pair: keep one line per pair and path.
        if any(t["a"] == a and t["b"] == b and t["via"] == via for t in transports):
            return
        transports.append({"a": a, "b": b, "transport": via.split("/")[0], "via": via, "line": line.number})

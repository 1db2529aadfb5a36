"""The GPU worker's view of its host: GPUs, how they are linked, driver and package versions.

`take_inventory()` reads NVML through pynvml (package nvidia-ml-py, imported when called) and never
raises: without pynvml or a driver the lists are empty and `reason` says why. Versions come from package
metadata, so nothing heavy (torch) is imported to learn them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dispatchlab.core.arch import arch_from_capability, arch_from_gpu_name

INSTALL_HINT = "pynvml is not installed: pip install 'dispatchlab[gpu]'"

# Reported key -> distribution name.
PACKAGES = {
    "sglang": "sglang",
    "vllm": "vllm",
    "flashinfer": "flashinfer-python",
    "flashinfer-cubin": "flashinfer-cubin",
    "flashinfer-jit-cache": "flashinfer-jit-cache",
    "sgl-kernel": "sgl-kernel",
    "torch": "torch",
    "triton": "triton",
    "nvidia-ml-py": "nvidia-ml-py",
}

# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` names them.
_TOPOLOGY_KIND = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# Datasheet GB/s of one NVLink link, both directions together (H100: 18 links, 900 GB/s).
_NVLINK_LINK_GBPS = {
    "sm_70": 50.0,
    "sm_80": 50.0,
    "sm_86": 28.125,
    "sm_90": 50.0,
    "sm_100": 100.0,
    "sm_103": 100.0,
}

# GB/s of one PCIe lane in one direction, by generation (after line encoding).
_PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

_NVLINK_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH


@dataclass
class GpuInfo:
    index: int
    name: str
    arch: str | None
    memory_mib: int | None
    capability: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    sm_clock_max_mhz: int | None = None
    sm_clock_mhz: int | None = None
    memory_clock_max_mhz: int | None = None
    memory_clock_mhz: int | None = None
    power_limit_w: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    nvlinks: int = 0  # active NVLink links
    nvlink_version: int | None = None  # as NVML reports it (an nvmlNvlinkVersion_t on recent drivers)


@dataclass
class Link:
    a: int
    b: int
    kind: str  # "NV<n>" or the PCIe path as nvidia-smi topo names it: PIX, PXB, PHB, NODE, SYS
    gbps: float | None  # datasheet GB/s of the path, both directions together


@dataclass
class Inventory:
    gpus: list[GpuInfo] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    driver: str | None = None
    cuda_version: str | None = None  # the newest CUDA the driver supports ("13.0")
    versions: dict[str, str | None] = field(default_factory=dict)
    torch_cuda: str | None = None  # the CUDA torch was built for
    hostname: str = ""
    cpu_count: int | None = None
    reason: str | None = None  # why `gpus` is empty, when it is

    @property
    def arches(self) -> list[str]:
        return sorted({g.arch for g in self.gpus if g.arch})

    @property
    def queues(self) -> list[str]:
        return ["gpu", *(f"gpu.{arch}" for arch in self.arches)]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["queues"] = self.queues
        return data


def take_inventory() -> Inventory:
    inventory = Inventory(
        versions=package_versions(),
        torch_cuda=torch_cuda_version(),
        hostname=socket.gethostname(),
        cpu_count=_cpu_count(),
    )
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        inventory.reason = INSTALL_HINT
        return inventory
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        inventory.reason = f"no NVIDIA driver: {error}"
        return inventory
    try:
        _read_nvml(nvml, inventory)
    finally:
        _call(nvml, nvml.nvmlShutdown)
    if not inventory.gpus and inventory.reason is None:
        inventory.reason = "the NVIDIA driver sees no GPU"
    return inventory


def _read_nvml(nvml: Any, inventory: Inventory) -> None:
    inventory.driver = _text(_call(nvml, nvml.nvmlSystemGetDriverVersion))
    cuda = _call(nvml, nvml.nvmlSystemGetCudaDriverVersion)
    if isinstance(cuda, int) and cuda > 0:
        inventory.cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    count = _call(nvml, nvml.nvmlDeviceGetCount) or 0
    handles = []
    for index in range(count):
        handle = _call(nvml, nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            continue
        handles.append(handle)
        inventory.gpus.append(_read_gpu(nvml, index, handle))
    inventory.links = _links(nvml, inventory.gpus, handles)


def _read_gpu(nvml: Any, index: int, handle: Any) -> GpuInfo:
    name = _text(_call(nvml, nvml.nvmlDeviceGetName, handle)) or "unknown"
    capability = _call(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    cc = f"{capability[0]}.{capability[1]}" if capability else None
    memory = _call(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    power_mw = _call(nvml, nvml.nvmlDeviceGetPowerManagementLimit, handle)
    pci = _call(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    clock = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    gpu = GpuInfo(
        index=index,
        name=name,
        arch=arch_from_capability(cc) or arch_from_gpu_name(name),
        memory_mib=int(memory.total) // (1 << 20) if memory is not None else None,
        capability=cc,
        uuid=_text(_call(nvml, nvml.nvmlDeviceGetUUID, handle)),
        bus_id=_text(pci.busId) if pci is not None else None,
        sm_clock_max_mhz=_call(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, clock[0]),
        sm_clock_mhz=_call(nvml, nvml.nvmlDeviceGetClockInfo, handle, clock[0]),
        memory_clock_max_mhz=_call(nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, clock[1]),
        memory_clock_mhz=_call(nvml, nvml.nvmlDeviceGetClockInfo, handle, clock[1]),
        power_limit_w=power_mw / 1000 if isinstance(power_mw, int | float) else None,
        pcie_gen=_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_width=_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        pcie_max_gen=_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        pcie_max_width=_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
    )
    for link in _active_nvlinks(nvml, handle):
        gpu.nvlinks += 1
        if gpu.nvlink_version is None:
            gpu.nvlink_version = _call(nvml, nvml.nvmlDeviceGetNvLinkVersion, handle, link)
    return gpu


def _active_nvlinks(nvml: Any, handle: Any) -> list[int]:
    active = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            # NotSupported on GPUs without NVLink; InvalidArgument past the last link of this GPU.
            continue
        if state == nvml.NVML_FEATURE_ENABLED:
            active.append(link)
    return active


def _links(nvml: Any, gpus: list[GpuInfo], handles: list[Any]) -> list[Link]:
    """One entry per GPU pair: NVLink where links join them (directly or through NVSwitch), else the
    PCIe path between them."""
    if len(gpus) < 2:
        return []
    by_bus = {_bus_key(g.bus_id): g.index for g in gpus if g.bus_id}
    direct: dict[tuple[int, int], int] = {}
    switched: dict[int, int] = {}
    for gpu, handle in zip(gpus, handles, strict=True):
        for link in _active_nvlinks(nvml, handle):
            kind = _call(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if kind == _NVLINK_SWITCH:
                switched[gpu.index] = switched.get(gpu.index, 0) + 1
                continue
            remote = _call(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            peer = by_bus.get(_bus_key(remote.busId)) if remote is not None else None
            if peer is not None and peer != gpu.index:
                pair = (min(gpu.index, peer), max(gpu.index, peer))
                direct[pair] = direct.get(pair, 0) + 1
    links = []
    for i, first in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            second = gpus[j]
            pair = (first.index, second.index)
            # Each direct link is seen from both ends.
            count = direct.get(pair, 0) // 2 or min(switched.get(pair[0], 0), switched.get(pair[1], 0))
            if count:
                per_link = _NVLINK_LINK_GBPS.get(first.arch or "")
                links.append(Link(*pair, f"NV{count}", per_link * count if per_link else None))
                continue
            level = _call(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
            links.append(Link(*pair, _TOPOLOGY_KIND.get(level, "SYS"), _pcie_gbps(first, second)))
    return links


def _pcie_gbps(a: GpuInfo, b: GpuInfo) -> float | None:
    gens = [g for g in (a.pcie_max_gen, b.pcie_max_gen) if g]
    widths = [w for w in (a.pcie_max_width, b.pcie_max_width) if w]
    if not gens or not widths or min(gens) not in _PCIE_LANE_GBPS:
        return None
    return round(2 * _PCIE_LANE_GBPS[min(gens)] * min(widths), 1)


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for key, dist in PACKAGES.items():
        try:
            versions[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def torch_cuda_version() -> str | None:
    """torch.version.cuda, read from torch/version.py without importing torch (seconds, and a CUDA init)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return m.group(1) if m else None
    return None


def summary_lines(inventory: Inventory) -> list[str]:
    """The inventory for people: one line per GPU, then links, versions and queues."""
    lines = []
    for g in inventory.gpus:
        memory = f"{g.memory_mib} MiB" if g.memory_mib is not None else "memory unknown"
        clocks = f", SM {g.sm_clock_max_mhz} MHz max" if g.sm_clock_max_mhz else ""
        power = f", {g.power_limit_w:.0f} W" if g.power_limit_w else ""
        nvlink = f", {g.nvlinks} NVLink links" if g.nvlinks else ""
        lines.append(f"GPU {g.index}: {g.name} ({g.arch or 'unknown arch'}, {memory}{clocks}{power}{nvlink})")
    for link in inventory.links:
        speed = f" ~{link.gbps:g} GB/s" if link.gbps else ""
        lines.append(f"GPU {link.a} <-> GPU {link.b}: {link.kind}{speed}")
    if inventory.reason:
        lines.append(f"no GPU: {inventory.reason}")
    driver = inventory.driver or "none"
    cuda = f", CUDA {inventory.cuda_version}" if inventory.cuda_version else ""
    lines.append(f"host {inventory.hostname}, {inventory.cpu_count} CPUs, driver {driver}{cuda}")
    installed = [f"{k} {v}" for k, v in inventory.versions.items() if v]
    if inventory.torch_cuda:
        installed.append(f"torch CUDA {inventory.torch_cuda}")
    lines.append("packages: " + (", ".join(installed) if installed else "none of " + ", ".join(PACKAGES)))
    lines.append("queues: " + ", ".join(inventory.queues))
    return lines


def _call(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """An NVML query, or None where this GPU or driver does not support it."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_key(value: Any) -> str:
    """NVML bus ids come as '00000000:18:00.0' (or bytes, or with a 4-digit domain): compare them by the
    bus/device/function part, lower-cased."""
    text = _text(value) or ""
    return text.lower().split(":", 1)[-1] if text.count(":") >= 2 else text.lower()


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()

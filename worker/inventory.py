"""The GPU worker's view of its host: GPUs, how they are linked, driver and package versions.

`take_inventory()` reads NVML through pynvml (package nvidia-ml-py, imported when called) and never
raises: without pynvml or a driver the lists are empty and `reason` says why. Versions come from package
metadata, so nothing heavy (torch) is imported to learn them.

`links` holds one entry per GPU pair (none with fewer than two GPUs): NV<n> where n NVLink links join them
(directly or through NVSwitch), else the PCIe path as `nvidia-smi topo -m` names it, with `gbps`, the
datasheet bandwidth in GB/s per direction (NVLink4 on H100/H200: 18 links x 25 = 450 GB/s; PCIe 5.0 x16:
63 GB/s) and its source.

`flashinfer_artifacts()` says whether FlashInfer's download-at-first-use kernels (the trtllm-gen cubins of
its MoE, FP4 GEMM and attention paths) can be had on this host without waiting on a download that cannot
succeed: a matching `flashinfer-cubin` installed, `FLASHINFER_CUBIN_DIR` set to a populated folder, or the
download host of FlashInfer's own configured base URL answering a plain TCP connect within 2 s. It lives in
worker.artifacts, the package versions in worker.versions; both are re-exported here, and the inventory
calls `flashinfer_artifacts` through this module (what a test replaces here, the inventory uses).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from dispatchlab.core.arch import arch_from_capability, arch_from_gpu_name
from worker.artifacts import (
    ARTIFACT_CONNECT_TIMEOUT_S,
    FLASHINFER_DEFAULT_REPOSITORY,
    ArtifactState,
    ArtifactStatus,
    Connector,
    Resolver,
    fix_for,
    flashinfer_artifacts,
    flashinfer_repository,
    reach,
)
from worker.versions import PACKAGES, package_versions, torch_cuda_version

__all__ = [
    "ARTIFACT_CONNECT_TIMEOUT_S",
    "FLASHINFER_DEFAULT_REPOSITORY",
    "INSTALL_HINT",
    "PACKAGES",
    "ArtifactState",
    "ArtifactStatus",
    "Connector",
    "GpuInfo",
    "Inventory",
    "Link",
    "Resolver",
    "fix_for",
    "flashinfer_artifacts",
    "flashinfer_repository",
    "package_versions",
    "reach",
    "summary_lines",
    "take_inventory",
    "torch_cuda_version",
]

INSTALL_HINT = "pynvml is not installed: pip install 'dispatchlab[gpu]'"


# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` names them: INTERNAL (one
# board), PIX (one PCIe switch), PXB (several switches, no host bridge), PHB (a host bridge), NODE (host
# bridges of one NUMA node), SYS (across NUMA nodes, over the CPU interconnect).
_TOPOLOGY_KIND = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# Link bandwidths are datasheet GB/s (1e9 bytes/s) PER DIRECTION, the figure nccl-tests' bus bandwidth is
# measured against. NVIDIA's datasheets quote both directions together: H100/H200 SXM "NVLink 900 GB/s"
# over 18 NVLink4 links (25 GB/s a link each way), B200 1.8 TB/s over 18 NVLink5 links (50), A100 600 GB/s
# over 12 NVLink3 links (25), V100 300 GB/s over 6 NVLink2 links (25), P100 160 GB/s over 4 NVLink1 links
# (20), A40 / RTX A6000 112.5 GB/s over a 4-link NVLink bridge (14.0625). `nvidia-smi nvlink -s` shows
# 26.562 GB/s a link on the lent H200s: NVLink4's signalling rate, above the datasheet's 25.
NVLINK_SOURCE = "NVIDIA datasheet, per direction: {links} NVLink{gen} links x {per_link:g} GB/s"
PCIE_SOURCE = "PCIe {gen}.0 x{width} signalling after encoding, per direction (PCI-SIG)"
_NVLINK_LINK_GBPS = {
    "sm_60": 20.0,
    "sm_70": 25.0,
    "sm_80": 25.0,
    "sm_86": 14.0625,
    "sm_90": 25.0,
    "sm_100": 50.0,
    "sm_103": 50.0,
}
_NVLINK_GENERATION = {"sm_60": 1, "sm_70": 2, "sm_80": 3, "sm_86": 3, "sm_90": 4, "sm_100": 5, "sm_103": 5}
# nvmlNvlinkVersion_t (NVML_NVLINK_VERSION_1_0 = 1 ... 5_0 = 7, 6_0 = 8) -> NVLink generation, for an
# architecture the table above does not know.
_NVML_NVLINK_VERSION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}

# GB/s of one PCIe lane in one direction, by generation (after line encoding).
_PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

_NVLINK_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
# nvmlGpuP2PCapsIndex_t: pynvml spells NVML_P2P_CAPS_INDEX_READ as a tuple, so the numbers are used.
_P2P_READ, _P2P_NVLINK = 0, 2
_P2P_STATUS_OK = 0


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
    """How two GPUs reach each other, as `nvidia-smi topo -m` shows it, with the datasheet bandwidth."""

    a: int
    b: int
    kind: str  # "NV<n>" (n NVLink links) or the PCIe path: PIX, PXB, PHB, NODE, SYS
    gbps: float | None  # datasheet GB/s PER DIRECTION of the path (see `source`)
    transport: str = "pcie"  # "nvlink" or "pcie"
    nvlink_gen: int | None = None  # NVLink generation (4 on H100/H200)
    lanes: int | None = None  # NVLink links, or PCIe lanes of the narrower end
    pcie_gen: int | None = None  # PCIe generation of the slower end
    switched: bool = False  # NVLink through NVSwitch rather than GPU to GPU
    p2p: bool | None = None  # NVML: the pair can read each other's memory peer to peer
    gbps_bidirectional: float | None = None  # both directions together, as datasheets quote it
    source: str | None = None  # where `gbps` comes from


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
    flashinfer_artifacts: ArtifactStatus | None = None  # see flashinfer_artifacts()

    @property
    def arches(self) -> list[str]:
        return sorted({g.arch for g in self.gpus if g.arch})

    @property
    def queues(self) -> list[str]:
        return ["gpu", *(f"gpu.{arch}" for arch in self.arches)]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["queues"] = self.queues
        artifacts = self.flashinfer_artifacts
        data["flashinfer_artifacts"] = artifacts.to_dict() if artifacts is not None else None
        return data


def take_inventory() -> Inventory:
    inventory = Inventory(
        versions=package_versions(),
        torch_cuda=torch_cuda_version(),
        hostname=socket.gethostname(),
        cpu_count=_cpu_count(),
        flashinfer_artifacts=flashinfer_artifacts(),
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
    # Older pynvml releases lack these: then NVML's P2P status below says whether NVLink joins a pair.
    remote_type = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    remote_pci = getattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
    for gpu, handle in zip(gpus, handles, strict=True):
        for link in _active_nvlinks(nvml, handle):
            kind = _call(nvml, remote_type, handle, link) if remote_type else None
            if kind == _NVLINK_SWITCH:
                switched[gpu.index] = switched.get(gpu.index, 0) + 1
                continue
            remote = _call(nvml, remote_pci, handle, link) if remote_pci else None
            peer = by_bus.get(_bus_key(remote.busId)) if remote is not None else None
            if peer is not None and peer != gpu.index:
                pair = (min(gpu.index, peer), max(gpu.index, peer))
                direct[pair] = direct.get(pair, 0) + 1
    links = []
    for i, first in enumerate(gpus):
        for j in range(i + 1, len(gpus)):
            second = gpus[j]
            pair = (first.index, second.index)
            pair_handles = handles[i], handles[j]
            p2p = _p2p(nvml, *pair_handles, _P2P_READ)
            # Each direct link is seen from both ends.
            count = direct.get(pair, 0) // 2
            through_switch = not count and bool(switched.get(pair[0]) and switched.get(pair[1]))
            if through_switch:
                count = min(switched[pair[0]], switched[pair[1]])
            elif not count and first.nvlinks and second.nvlinks and _p2p(nvml, *pair_handles, _P2P_NVLINK):
                # A driver that names no remote device type: NVML still says whether NVLink joins them.
                count = min(first.nvlinks, second.nvlinks)
            if count:
                links.append(_nvlink(pair, first, count, switched=through_switch, p2p=p2p))
                continue
            level = _call(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, *pair_handles)
            links.append(_pcie(pair, _TOPOLOGY_KIND.get(level, "SYS"), first, second, p2p=p2p))
    return links


def _nvlink(pair: tuple[int, int], gpu: GpuInfo, count: int, *, switched: bool, p2p: bool | None) -> Link:
    arch = gpu.arch or ""
    gen = _NVLINK_GENERATION.get(arch) or _NVML_NVLINK_VERSION.get(gpu.nvlink_version or 0)
    per_link = _NVLINK_LINK_GBPS.get(arch)
    gbps = round(per_link * count, 2) if per_link else None
    return Link(
        *pair,
        kind=f"NV{count}",
        gbps=gbps,
        transport="nvlink",
        nvlink_gen=gen,
        lanes=count,
        switched=switched,
        p2p=p2p,
        gbps_bidirectional=round(2 * gbps, 2) if gbps else None,
        source=NVLINK_SOURCE.format(links=count, gen=gen or "", per_link=per_link) if per_link else None,
    )


def _pcie(pair: tuple[int, int], kind: str, a: GpuInfo, b: GpuInfo, *, p2p: bool | None) -> Link:
    """The PCIe path at the slower end's generation and width (the most each GPU's slot trains to)."""
    gens = [g for g in (a.pcie_max_gen, b.pcie_max_gen) if g]
    widths = [w for w in (a.pcie_max_width, b.pcie_max_width) if w]
    gen, width = (min(gens) if gens else None), (min(widths) if widths else None)
    gbps = None
    if gen in _PCIE_LANE_GBPS and width:
        gbps = round(_PCIE_LANE_GBPS[gen] * width, 1)
    return Link(
        *pair,
        kind=kind,
        gbps=gbps,
        transport="pcie",
        lanes=width,
        pcie_gen=gen,
        p2p=p2p,
        gbps_bidirectional=round(2 * gbps, 1) if gbps else None,
        source=PCIE_SOURCE.format(gen=gen, width=width) if gbps else None,
    )


def _p2p(nvml: Any, first: Any, second: Any, index: int) -> bool | None:
    """NVML's verdict on peer-to-peer access of one kind between two GPUs; None where it cannot say."""
    query = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
    if query is None:
        return None
    status = _call(nvml, query, first, second, index)
    return None if status is None else status == _P2P_STATUS_OK


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
        speed = f" ~{link.gbps:g} GB/s per direction" if link.gbps else ""
        p2p = {True: ", P2P", False: ", no P2P", None: ""}[link.p2p]
        lines.append(f"GPU {link.a} <-> GPU {link.b}: {link.kind}{speed}{p2p}")
    if inventory.reason:
        lines.append(f"no GPU: {inventory.reason}")
    driver = inventory.driver or "none"
    cuda = f", CUDA {inventory.cuda_version}" if inventory.cuda_version else ""
    lines.append(f"host {inventory.hostname}, {inventory.cpu_count} CPUs, driver {driver}{cuda}")
    installed = [f"{k} {v}" for k, v in inventory.versions.items() if v]
    if inventory.torch_cuda:
        installed.append(f"torch CUDA {inventory.torch_cuda}")
    lines.append("packages: " + (", ".join(installed) if installed else "none of " + ", ".join(PACKAGES)))
    if inventory.flashinfer_artifacts is not None:
        lines.append(inventory.flashinfer_artifacts.summary())
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

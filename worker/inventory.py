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
download host of FlashInfer's own configured base URL answering a plain TCP connect within 2 s.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


# ---------------------------------------------------------------- FlashInfer's downloaded kernels

ARTIFACT_CONNECT_TIMEOUT_S = 2.0
# FlashInfer's default, read from flashinfer/jit/cubin_loader.py when FlashInfer is installed; this copy
# (FlashInfer 0.6.1) is used only when that file cannot be read.
FLASHINFER_DEFAULT_REPOSITORY = (
    "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/"
)
_REPOSITORY_IN_SOURCE = re.compile(
    r"FLASHINFER_CUBINS_REPOSITORY\s*=\s*os\.environ\.get\(\s*['\"]FLASHINFER_CUBINS_REPOSITORY['\"]\s*,"
    r"\s*['\"]([^'\"]+)['\"]"
)
_COUNT_CAP = 100_000  # files counted in a cubin folder before giving up counting

Resolver = Callable[[str, int], list[tuple[Any, ...]]]  # socket.getaddrinfo's shape
Connector = Callable[[int, tuple[Any, ...], float], None]  # family, address, seconds left


class ArtifactState(StrEnum):
    AVAILABLE = "available"  # a matching flashinfer-cubin, a populated FLASHINFER_CUBIN_DIR, or the host
    MISSING = "missing_artifacts"  # none of those: a download-at-first-use kernel would wait, then fail
    VERSION_MISMATCH = "version_mismatch"  # flashinfer-cubin / -jit-cache of another version: import fails
    NOT_INSTALLED = "not_installed"  # no FlashInfer at all


@dataclass
class ArtifactStatus:
    """Whether FlashInfer's download-at-first-use kernels (the trtllm-gen cubins) can be had here."""

    state: ArtifactState
    flashinfer: str | None = None  # flashinfer-python's version
    cubin_package: str | None = None  # flashinfer-cubin's version, when installed
    jit_cache_package: str | None = None  # flashinfer-jit-cache's version, when installed
    cubin_dir: str | None = None  # FLASHINFER_CUBIN_DIR as set
    cubin_dir_files: int | None = None  # files under it
    download_url: str | None = None  # FlashInfer's configured base URL for cubins
    download_url_from: str | None = None  # where that URL was read
    download_host: str | None = None  # host:port the URL names
    reachable: bool | None = None  # None: not checked (not needed, or nothing to connect to)
    reach_detail: str | None = None  # how the TCP connect went, or why it was not tried
    source: str | None = None  # what makes the kernels available
    reason: str | None = None  # why they are not
    fix: str | None = None  # what to install or set

    @property
    def available(self) -> bool:
        return self.state == ArtifactState.AVAILABLE

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = str(self.state)
        data["available"] = self.available
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArtifactStatus:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["state"] = ArtifactState(values.get("state", ArtifactState.MISSING))
        return cls(**values)

    def summary(self) -> str:
        """One line for people: 'FlashInfer downloaded kernels: <state>: <source or reason> (fix: ...)'."""
        head = f"FlashInfer download-at-first-use kernels: {self.state}"
        if self.available:
            return f"{head} ({self.source})"
        text = f"{head}: {self.reason}" if self.reason else head
        return f"{text}; fix: {self.fix}" if self.fix else text


def flashinfer_artifacts(
    *,
    environ: Mapping[str, str] | None = None,
    versions: Mapping[str, str | None] | None = None,
    resolve: Resolver | None = None,
    connect: Connector | None = None,
    timeout_s: float = ARTIFACT_CONNECT_TIMEOUT_S,
) -> ArtifactStatus:
    """What FlashInfer would find for a kernel it downloads at first use, decided in at most `timeout_s`
    (one plain TCP connect to the host of FlashInfer's configured base URL, only when nothing local
    provides the kernels). Never raises; nothing is downloaded."""
    env = os.environ if environ is None else environ
    found = package_versions() if versions is None else versions
    status = ArtifactStatus(
        ArtifactState.MISSING,
        flashinfer=found.get("flashinfer"),
        cubin_package=found.get("flashinfer-cubin"),
        jit_cache_package=found.get("flashinfer-jit-cache"),
    )
    version = status.flashinfer
    if version is None:
        status.state, status.reason = ArtifactState.NOT_INSTALLED, "flashinfer-python is not installed"
        status.reach_detail = "not checked: no FlashInfer"
        return status
    status.fix = fix_for(version)
    mismatched = [
        f"{name} {other}"
        for name, other in (
            ("flashinfer-cubin", status.cubin_package),
            ("flashinfer-jit-cache", status.jit_cache_package),
        )
        if other is not None and _public(other) != _public(version)
    ]
    if mismatched and not env.get("FLASHINFER_DISABLE_VERSION_CHECK"):
        status.state = ArtifactState.VERSION_MISMATCH
        status.reason = (
            f"{' and '.join(mismatched)} installed beside flashinfer {version}: FlashInfer refuses to load"
        )
        status.reach_detail = "not checked: the installed packages decide"
        return status
    if status.cubin_package is not None:
        status.state = ArtifactState.AVAILABLE
        status.source = f"flashinfer-cubin {status.cubin_package} installed (flashinfer {version})"
        status.reach_detail = "not checked: the cubins are installed"
        return status
    cubin_dir = env.get("FLASHINFER_CUBIN_DIR")
    notes = []
    if cubin_dir:
        status.cubin_dir, status.cubin_dir_files = cubin_dir, _count_files(Path(cubin_dir))
        if status.cubin_dir_files:
            status.state = ArtifactState.AVAILABLE
            status.source = f"FLASHINFER_CUBIN_DIR={cubin_dir} holds {status.cubin_dir_files} files"
            status.reach_detail = "not checked: FLASHINFER_CUBIN_DIR is populated"
            return status
        notes.append(f"FLASHINFER_CUBIN_DIR={cubin_dir} is empty or missing")
    else:
        notes.append("no flashinfer-cubin package and FLASHINFER_CUBIN_DIR is not set")
    url, status.download_url_from = flashinfer_repository(env)
    status.download_url = url
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):  # FlashInfer copies from a local repository path
        local = Path(parts.path or url)
        status.reach_detail = f"local repository {local}: {'exists' if local.is_dir() else 'missing'}"
        status.reachable = local.is_dir()
    elif not parts.hostname:
        status.reach_detail = f"cannot tell a host from {url!r}"
    else:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        status.download_host = f"{parts.hostname}:{port}"
        status.reachable, status.reach_detail = reach(
            parts.hostname, port, timeout_s=timeout_s, resolve=resolve, connect=connect
        )
    if status.reachable:
        status.state = ArtifactState.AVAILABLE
        status.source = (
            f"{status.download_host or url} reachable ({status.reach_detail}): FlashInfer downloads each "
            "cubin at first use"
        )
        return status
    status.reason = f"{'; '.join(notes)}; download host {status.download_host or url}: {status.reach_detail}"
    return status


def fix_for(version: str) -> str:
    """What makes FlashInfer's downloaded kernels available on an offline host."""
    return (
        f"pip install flashinfer-cubin=={version} (a wheel fetched with `pip download "
        f"flashinfer-cubin=={version}` where there is network), or set FLASHINFER_CUBIN_DIR to a folder of "
        f"FlashInfer {version}'s cubins; flashinfer-jit-cache=={version} also spares the JIT builds"
    )


def flashinfer_repository(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """FlashInfer's base URL for cubins and where it was read: FLASHINFER_CUBINS_REPOSITORY, else the
    default in the installed flashinfer/jit/cubin_loader.py (read as text: importing flashinfer imports
    torch), else this module's copy of it."""
    env = os.environ if environ is None else environ
    if env.get("FLASHINFER_CUBINS_REPOSITORY"):
        return env["FLASHINFER_CUBINS_REPOSITORY"], "FLASHINFER_CUBINS_REPOSITORY"
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "jit" / "cubin_loader.py"
        try:
            m = _REPOSITORY_IN_SOURCE.search(path.read_text(encoding="utf-8"))
        except OSError:
            continue
        if m:
            return m.group(1), str(path)
    return FLASHINFER_DEFAULT_REPOSITORY, "dispatchlab's copy of FlashInfer 0.6.1's default"


def reach(
    host: str,
    port: int,
    *,
    timeout_s: float = ARTIFACT_CONNECT_TIMEOUT_S,
    resolve: Resolver | None = None,
    connect: Connector | None = None,
) -> tuple[bool, str]:
    """A plain TCP connect to host:port, name resolution included, in at most `timeout_s` (getaddrinfo
    has no timeout of its own, so it runs in a daemon thread that is abandoned past the limit)."""
    resolver: Resolver = resolve or (lambda h, p: socket.getaddrinfo(h, p, type=socket.SOCK_STREAM))
    connector: Connector = connect or _tcp_connect
    started = time.monotonic()
    box: dict[str, Any] = {}

    def lookup() -> None:
        try:
            box["addresses"] = resolver(host, port)
        except OSError as error:
            box["error"] = error

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False, f"resolving {host} took longer than {timeout_s:g} s"
    if "error" in box:
        return False, f"cannot resolve {host}: {box['error']}"
    last = "no address"
    for family, _type, _proto, _name, address in box.get("addresses") or []:
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            return False, f"no TCP connection to {host}:{port} within {timeout_s:g} s"
        try:
            connector(family, address, left)
        except OSError as error:
            last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            continue
        return True, f"TCP connect to {host}:{port} in {time.monotonic() - started:.2f} s"
    return False, f"no TCP connection to {host}:{port} ({last})"


def _tcp_connect(family: int, address: tuple[Any, ...], timeout_s: float) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(address)


def _public(version: str) -> str:
    """A version without its local part (0.6.1+cu129 -> 0.6.1), as FlashInfer compares them."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def _count_files(folder: Path) -> int:
    count = 0
    try:
        for _root, _dirs, files in os.walk(folder):
            count += len(files)
            if count >= _COUNT_CAP:
                break
    except OSError:
        return 0
    return count


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

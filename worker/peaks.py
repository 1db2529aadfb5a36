"""Datasheet peaks per GPU model, looked up by the name NVML (or torch) reports.

Dense figures (sparse ones are twice these): TFLOP/s for `bf16`, `fp8` and `fp4` tensor-core math, GB/s
for `memory` (HBM or GDDR) and `link` (the GPU-to-GPU link, both directions together as datasheets quote it:
NVLink, else PCIe; `link_gbps_per_direction` halves it for bus-bandwidth comparisons). Values
come from NVIDIA's datasheets; where NVIDIA only publishes sparse figures (RTX PRO 6000 Blackwell) they
are halved. A probe's `peak_fraction` is its measured rate over one of these: a lead, since a card's real
ceiling sits below its datasheet (H200: bf16 GEMM about 790 of 989 TFLOP/s, copy about 4.3 of 4.8 TB/s).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

METRICS = ("bf16", "fp8", "fp4", "memory", "link")


@dataclass(frozen=True)
class Peak:
    model: str
    bf16: float | None  # dense TFLOP/s
    fp8: float | None
    fp4: float | None
    memory: float  # GB/s
    link: float | None  # GB/s, both directions together

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# First match wins, so the more specific names (H200 NVL, H100 PCIe) come before the plain ones.
# NVML spells them e.g. "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
# "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA GeForce RTX 5090", "NVIDIA L40S".
_TABLE: list[tuple[re.Pattern[str], Peak]] = [
    (re.compile(p, re.I), peak)
    for p, peak in [
        (r"\bGB300\b", Peak("GB300", 2500, 5000, 15000, 8000, 1800)),
        (r"\bB300\b", Peak("B300 (HGX)", 2250, 4500, 13500, 8000, 1800)),
        (r"\bGB200\b", Peak("GB200", 2500, 5000, 10000, 8000, 1800)),
        (r"\bB200\b", Peak("B200 (HGX)", 2250, 4500, 9000, 8000, 1800)),
        (r"\bH200 NVL\b", Peak("H200 NVL", 835, 1671, None, 4800, 900)),
        (r"\bH200\b", Peak("H200 SXM", 989, 1979, None, 4800, 900)),
        (r"\bGH200\b", Peak("GH200", 989, 1979, None, 4000, 900)),
        (r"\bH100 NVL\b", Peak("H100 NVL", 835, 1671, None, 3900, 600)),
        (r"\bH100\b.*\bPCIe\b", Peak("H100 PCIe", 756, 1513, None, 2000, 128)),
        (r"\bH100\b|\bH800\b", Peak("H100 SXM", 989, 1979, None, 3350, 900)),
        (r"\bH20\b", Peak("H20", 148, 296, None, 4000, 900)),
        (r"RTX PRO 6000\b", Peak("RTX PRO 6000 Blackwell", 500, 1000, 2000, 1792, 128)),
        (r"RTX 5090\b", Peak("GeForce RTX 5090", 210, 838, 1676, 1792, 128)),
        (r"\bL40S\b", Peak("L40S", 362, 733, None, 864, 64)),
        (r"\bL40\b", Peak("L40", 181, 362, None, 864, 64)),
        (r"\bL4\b", Peak("L4", 121, 242, None, 300, 64)),
        (r"\bA100\b.*\b80GB\b.*PCIe", Peak("A100 80GB PCIe", 312, None, None, 1935, 600)),
        (r"\bA100\b.*\b80GB\b", Peak("A100 SXM 80GB", 312, None, None, 2039, 600)),
        (r"\bA100\b", Peak("A100 40GB", 312, None, None, 1555, 600)),
    ]
]


def peaks_for(gpu_name: str | None) -> Peak | None:
    """The datasheet row for a GPU name as NVML or torch reports it, or None for an unknown model."""
    if not gpu_name:
        return None
    name = gpu_name.replace("_", " ")
    for pattern, peak in _TABLE:
        if pattern.search(name):
            return peak
    return None


def peak_for(gpu_name: str | None, metric: str) -> float | None:
    """One figure (`bf16`, `fp8`, `fp4` in TFLOP/s; `memory`, `link` in GB/s) or None when not known."""
    if metric not in METRICS:
        raise ValueError(f"unknown peak metric {metric!r}: one of {', '.join(METRICS)}")
    peak = peaks_for(gpu_name)
    if peak is None:
        return None
    value = getattr(peak, metric)
    return float(value) if value is not None else None


def link_gbps_per_direction(gpu_name: str | None) -> float | None:
    """The datasheet GPU-to-GPU link in GB/s one way (H200 SXM: 450), the figure an all-reduce's bus
    bandwidth is compared with when the inventory knows no link between the GPUs."""
    link = peak_for(gpu_name, "link")
    return link / 2 if link else None

"""The communication component: what the NCCL all-reduce probe (worker.allreduce, one process per GPU)
measures and reads, without running anything: nccl-tests' arithmetic (algorithm and bus bandwidth, the
message sizes, the model's tensor-parallel size), NCCL's INFO log (the transport per rank pair, version,
NCCL_* settings, multicast), the link the ring runs at, and the per-size table for people.

    bus_bandwidth(nbytes, seconds, world_size) -> Bandwidth            nccl-tests' arithmetic
    read_nccl_log(lines) -> NcclLog                                    transports, version, env, multicast seen
    link_between(inventory, gpus) -> dict | None                       the slowest link among the GPUs
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from worker.inventory import Inventory
from worker.peaks import link_gbps_per_direction, peaks_for
from worker.probes.harness import ModelShapes, ProbeResult

MIN_BYTES = 1 << 20
MAX_BYTES = 1 << 30
BF16_BYTES = 2


# ---------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class Bandwidth:
    algbw_gbps: float  # bytes / time
    busbw_gbps: float  # algbw x 2(n-1)/n: what each GPU's link carried, comparable across world sizes


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> Bandwidth:
    """nccl-tests' all-reduce figures (doc/PERFORMANCE.md): algbw = S / t in GB/s (1e9 bytes), busbw =
    algbw x 2(n-1)/n, since a ring all-reduce sends and receives 2(n-1)/n x S through every GPU."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds!r} s")
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size!r}")
    algbw = nbytes / seconds / 1e9
    return Bandwidth(algbw, algbw * 2 * (world_size - 1) / world_size)


def model_tp_bytes(shapes: ModelShapes) -> int:
    """Bytes of one tensor-parallel all-reduce of the model's hidden states: hidden_size x tokens, bf16."""
    return shapes.hidden_size * shapes.tokens * BF16_BYTES


def message_sizes(
    extra: int | None = None, *, min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES
) -> list[int]:
    """Powers of two from min_bytes to max_bytes, and `extra` (the model's TP size) in its place."""
    sizes = set()
    size = min_bytes
    while size <= max_bytes:
        sizes.add(size)
        size *= 2
    if extra:
        sizes.add(extra - extra % BF16_BYTES)
    return sorted(s for s in sizes if s > 0)


def human_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


# ---------------------------------------------------------------- NCCL's INFO log


@dataclass(frozen=True)
class Transport:
    """How NCCL connected rank `a` to rank `b` (one direction), e.g. via P2P/CUMEM/read, SHM/direct/direct,
    NET/Socket/0, P2P/IPC; `a_dev`/`b_dev` as NCCL printed them (the NVML device, a bus id in old NCCL)."""

    a: int
    b: int
    via: str
    kind: str  # the first part of `via`: P2P, SHM, NET, NVLS, COLLNET
    channels: int  # how many channels use it
    a_dev: str
    b_dev: str
    direction: str | None = None  # "send" or "receive" where NCCL says (network transports)


@dataclass
class NcclLog:
    version: str | None = None  # "2.27.5+cuda12.9"
    transports: list[Transport] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* settings NCCL reported reading
    multicast: bool = False  # NCCL said NVLS multicast is available, or created or bound a multicast group
    warnings: list[str] = field(default_factory=list)  # NCCL WARN lines, first few
    lines: list[str] = field(default_factory=list)  # the channel lines themselves, first few, as evidence


# `<host>:<pid>:<tid> [<dev>] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`, as
# src/transport/{p2p,shm,net}.cc print it; older NCCL printed "Channel 00 :" and bus ids in brackets.
_CHANNEL = re.compile(
    r"NCCL INFO Channel (?P<channel>\d+)(?:/\d+)? : (?P<a>\d+)\[(?P<a_dev>[^\]]*)\] -> "
    r"(?P<b>\d+)\[(?P<b_dev>[^\]]*)\](?: \[(?P<direction>send|receive)\])? via (?P<via>\S.*?)\s*$"
)
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+\S*)")
_ENV = re.compile(r"NCCL INFO (?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\.?\s*$")
_MULTICAST = re.compile(
    r"NVLS multicast support is available|NVLS Creat(?:ing|ed) Multicast|Binding multicast| via NVLS\b"
)
_WARN = re.compile(r"NCCL WARN (?P<message>.*)$")
_MAX_WARNINGS = 10
_MAX_LINES = 8


def read_nccl_log(lines: Iterable[str]) -> NcclLog:
    """What NCCL_DEBUG=INFO output says about a communicator: the transport per rank pair (deduplicated
    over channels, in order of first appearance), the NCCL version, NCCL_* settings and any multicast."""
    log = NcclLog()
    seen: dict[tuple[int, int, str, str | None], tuple[dict[str, Any], set[int]]] = {}
    for raw in lines:
        line = raw.rstrip("\n")
        if match := _CHANNEL.search(line):
            via = match["via"]
            key = (int(match["a"]), int(match["b"]), via, match["direction"])
            entry = {"a": key[0], "b": key[1], "via": via, "a_dev": match["a_dev"], "b_dev": match["b_dev"]}
            seen.setdefault(key, (entry, set()))[1].add(int(match["channel"]))
            if len(log.lines) < _MAX_LINES:
                log.lines.append(line.strip())
        elif log.version is None and (match := _VERSION.search(line)):
            log.version = match["version"]
        elif match := _ENV.search(line):
            log.env[match["name"]] = match["value"]
        elif (match := _WARN.search(line)) and len(log.warnings) < _MAX_WARNINGS:
            log.warnings.append(match["message"].strip())
        if _MULTICAST.search(line):
            log.multicast = True
    for (_, _, via, direction), (entry, channels) in seen.items():
        kind = via.split("/", 1)[0].split()[0]
        log.transports.append(Transport(**entry, kind=kind, channels=len(channels), direction=direction))
    return log


# ---------------------------------------------------------------- the link


def link_between(inventory: Inventory, gpus: Sequence[int]) -> dict[str, Any] | None:
    """The slowest link among the pairs of these GPUs as the inventory describes it (a ring all-reduce
    runs at the pace of its slowest hop), else the GPU's datasheet link halved (worker.peaks)."""
    wanted = set(gpus)
    pairs = [link for link in inventory.links if link.a in wanted and link.b in wanted]
    known = [link for link in pairs if link.gbps]
    if known:
        return asdict(min(known, key=lambda link: link.gbps or 0.0))
    name = next((g.name for g in inventory.gpus if g.index in wanted), None)
    per_direction = link_gbps_per_direction(name)
    if pairs:
        data = asdict(pairs[0])
    elif per_direction is None:
        return None
    else:
        data = {"a": gpus[0], "b": gpus[1], "kind": None}
    peak = peaks_for(name)
    if per_direction is not None and peak is not None:
        data["gbps"] = per_direction
        data["source"] = f"datasheet link of the {peak.model} ({peak.link:g} GB/s both ways), halved"
    return data


# ---------------------------------------------------------------- for people


def size_table_lines(result: ProbeResult) -> list[str]:
    """Per size: time, algorithm and bus bandwidth, % of the link's datasheet peak; then link and transports."""
    sizes = result.extra.get("sizes") or []
    link = result.extra.get("link") or {}
    lines = []
    if sizes:
        lines.append(f"{'size':>10}  {'ms':>9}  {'algbw GB/s':>10}  {'busbw GB/s':>10}  {'% link':>6}  check")
        for row in sizes:
            peak = "-" if row["peak_fraction"] is None else f"{row['peak_fraction'] * 100:.0f}%"
            label = human_bytes(row["bytes"]) + (" (TP)" if row.get("model_tp") else "")
            check = "ok" if row["correct"] else "WRONG"
            lines.append(
                f"{label:>10}  {row['ms']:>9.4f}  {row['algbw_gbps']:>10.1f}  {row['busbw_gbps']:>10.1f}"
                f"  {peak:>6}  {check}"
            )
    if link:
        speed = f"{link['gbps']:g} GB/s per direction" if link.get("gbps") else "bandwidth unknown"
        lines.append(f"link GPU {link.get('a')} <-> GPU {link.get('b')}: {link.get('kind') or '?'}, {speed}")
    for t in result.extra.get("transports") or []:
        lines.append(f"NCCL rank {t['a']} -> rank {t['b']}: via {t['via']} ({t['channels']} channels)")
    if result.extra.get("nccl_version"):
        lines.append(
            f"NCCL {result.extra['nccl_version']}, multicast seen: {result.extra.get('multicast_seen')}"
        )
    return lines

"""How a multi-GPU host's GPUs are linked and what NCCL made of it, for the GPU pages: the link matrix
(like `nvidia-smi topo -m`), the transports NCCL chose in a report's log, and the all-reduce probe's bus
bandwidth measured against that link."""

from __future__ import annotations

import math
from typing import Any

from django.http import HttpRequest

from dispatchlab.front import gpu_figures
from dispatchlab.gpu import selectors as gpu_selectors
from dispatchlab.gpu.models import ProbeRun
from dispatchlab.gpu.selectors import allreduce_result
from dispatchlab.reports.models import Report

ALLREDUCE_MIN_GPUS = 2
# `nvidia-smi topo -m`'s legend, in its words
LINK_LEGEND = (
    ("X", "the GPU itself"),
    ("NV#", "a bonded set of # NVLinks, GPU to GPU or through NVSwitch"),
    ("PIX", "PCIe through at most one PCIe bridge"),
    ("PXB", "PCIe through several PCIe bridges, not the PCIe host bridge"),
    ("PHB", "PCIe through a PCIe host bridge (typically the CPU)"),
    ("NODE", "PCIe and the interconnect between PCIe host bridges within a NUMA node"),
    ("SYS", "PCIe and the SMP interconnect between NUMA nodes (QPI/UPI, Infinity Fabric)"),
)
# the transports NCCL names in its "Channel 00 : 0[0] -> 1[1] via P2P/CUMEM/read" lines
TRANSPORT_LEGEND = (
    ("P2P", "GPU to GPU directly, over NVLink or PCIe"),
    ("SHM", "through host shared memory: the GPUs cannot reach each other peer to peer"),
    ("NET", "over the network (InfiniBand, RoCE or sockets)"),
)


def _is_multi_gpu(doc: dict[str, Any]) -> bool:
    gpu = doc.get("gpu") if isinstance(doc.get("gpu"), dict) else {}
    count = gpu.get("count")
    return bool(
        (isinstance(count, int) and count > 1)
        or doc.get("failure_class") == "nccl_error"
        or doc.get("nccl_transports")
    )


def _rank_key(rank: Any) -> tuple[int, int, str]:
    return (0, rank, "") if isinstance(rank, int) else (1, 0, str(rank))


def links_context(request: HttpRequest, report: Report) -> dict[str, Any] | None:
    """The report's "GPU links" panel, for a crash on several GPUs: the transports NCCL chose per rank
    pair (from the log) and the newest all-reduce measured on a host of the report's arch. None for a
    single-GPU run."""
    doc = report.document if isinstance(report.document, dict) else None
    if doc is None or not _is_multi_gpu(doc):
        return None
    gpu = doc.get("gpu") if isinstance(doc.get("gpu"), dict) else {}
    arch = report.arch or str(gpu.get("arch") or "")
    transports = sorted(
        (
            {
                "a": t.get("a"),
                "b": t.get("b"),
                "transport": str(t.get("transport") or str(t.get("via") or "").split("/")[0]),
                "via": str(t.get("via") or ""),
                "line": t["line"] if isinstance(t.get("line"), int) and t["line"] > 0 else None,
            }
            for t in doc.get("nccl_transports") or []
            if isinstance(t, dict)
        ),
        key=lambda t: (_rank_key(t["a"]), _rank_key(t["b"]), t["via"]),
    )
    run = gpu_selectors.newest_allreduce(request.user, arch=arch)
    measured = None
    if run is not None:
        host_links = (run.host.inventory or {}).get("links") if run.host else None
        measured = allreduce_view(
            allreduce_result(run.results) or {},
            run=run,
            fig_id="report-allreduce-fig",
            link=first_link(host_links),
            height=260,
        )
    return {
        "count": gpu["count"] if isinstance(gpu.get("count"), int) and gpu["count"] > 1 else None,
        "arch": arch,
        "transports": transports,
        "transport_legend": TRANSPORT_LEGEND,
        "allreduce": measured,
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _gbps_text(value: Any) -> str:
    gbps = _number(value)
    if not gbps:
        return ""
    return f"{gbps:,.0f} GB/s" if gbps >= 10 else f"{gbps:.1f} GB/s"


def _link_class(kind: str) -> str:
    kind = kind.upper()
    if kind.startswith("NV"):
        return "nv"
    return {"PIX": "pix", "PXB": "pix", "PHB": "phb", "NODE": "phb", "SYS": "sys"}.get(kind, "other")


def _link_title(link: dict[str, Any]) -> str:
    """Everything the worker said about a link, for the cell's tooltip."""
    kind = str(link.get("kind") or "?")
    parts = [f"GPU{link.get('a')} ↔ GPU{link.get('b')}: {kind}"]
    if link.get("description"):
        parts.append(str(link["description"]))
    lanes = link.get("nvlink_links") or (link.get("lanes") if kind.upper().startswith("NV") else None)
    if lanes:
        gen = f"NVLink{link['nvlink_gen']}" if link.get("nvlink_gen") else "NVLink"
        parts.append(f"{lanes} {gen} links" + (" through NVSwitch" if link.get("switched") else ""))
    elif link.get("pcie_gen") and link.get("lanes"):
        parts.append(f"PCIe {link['pcie_gen']}.0 x{link['lanes']}")
    if _number(link.get("gbps")) is not None:
        both = _gbps_text(link.get("gbps_bidirectional"))
        parts.append(f"{_gbps_text(link['gbps'])} per direction" + (f" ({both} both ways)" if both else ""))
    if link.get("source"):
        parts.append(str(link["source"]))
    if isinstance(link.get("p2p"), bool):
        parts.append("peer to peer: " + ("yes" if link["p2p"] else "no"))
    return "\n".join(parts)


def first_link(links: Any) -> dict[str, Any] | None:
    """The link between the host's first two GPUs: the one a 2-GPU all-reduce runs over."""
    links = [link for link in links or [] if isinstance(link, dict)] if isinstance(links, list) else []
    pair = next((link for link in links if {link.get("a"), link.get("b")} == {0, 1}), None)
    return pair or (links[0] if links else None)


def link_matrix(gpus: list[Any], links: list[Any]) -> dict[str, Any] | None:
    """GPU x GPU like `nvidia-smi topo -m`: each cell the link's kind and datasheet bandwidth, "X" on
    the diagonal. None with fewer than two GPUs."""
    gpus = [g for g in gpus if isinstance(g, dict)]
    if len(gpus) < ALLREDUCE_MIN_GPUS:
        return None
    indices = [g["index"] if isinstance(g.get("index"), int) else n for n, g in enumerate(gpus)]
    by_pair: dict[frozenset[Any], dict[str, Any]] = {}
    for link in links:
        if isinstance(link, dict) and link.get("a") is not None and link.get("b") is not None:
            by_pair.setdefault(frozenset((link["a"], link["b"])), link)
    rows = []
    for a in indices:
        cells = []
        for b in indices:
            if a == b:
                cells.append({"kind": "X", "gbps": "", "css": "self", "title": f"GPU{a}"})
                continue
            link = by_pair.get(frozenset((a, b)))
            if link is None:
                cells.append({"kind": "—", "gbps": "", "css": "none", "title": "not reported"})
                continue
            kind = str(link.get("kind") or "?")
            cells.append(
                {
                    "kind": kind,
                    "gbps": _gbps_text(link.get("gbps")),
                    "css": _link_class(kind),
                    "title": _link_title({**link, "a": a, "b": b}),
                }
            )
        rows.append({"index": a, "cells": cells})
    return {"indices": indices, "rows": rows, "legend": LINK_LEGEND}


def allreduce_view(
    probe: dict[str, Any],
    *,
    run: ProbeRun | None,
    fig_id: str,
    link: dict[str, Any] | None = None,
    height: int = 320,
) -> dict[str, Any]:
    """An all-reduce result for the page: its verdict, the chart, a row per size, NCCL's transports."""
    extra = probe.get("extra") if isinstance(probe.get("extra"), dict) else {}
    link = gpu_figures.allreduce_link(probe) or link or {}
    peak = _number(link.get("gbps"))
    shape = probe.get("shape") if isinstance(probe.get("shape"), dict) else {}
    tp_bytes = _number(extra.get("model_tp_bytes"))
    sizes = gpu_figures.allreduce_sizes(probe)
    # the model's TP all-reduce size, measured as such, else the size closest to it on the log axis
    nearest = next((size for size in sizes if size.get("model_tp") is True), None)
    if nearest is None and sizes and tp_bytes and tp_bytes > 0:
        nearest = min(sizes, key=lambda size: abs(math.log2(float(size["bytes"]) / tp_bytes)))
    rows = []
    for size in sizes:
        fraction = gpu_figures.size_fraction(size, peak)
        rows.append(
            {
                "size": gpu_figures.size_text(float(size["bytes"])),
                "ms": f"{size['ms']:.4g}" if _number(size.get("ms")) is not None else "",
                "algbw": f"{size['algbw_gbps']:.1f}" if _number(size.get("algbw_gbps")) is not None else "",
                "busbw": f"{size['busbw_gbps']:.1f}" if _number(size.get("busbw_gbps")) is not None else "",
                "percent": f"{fraction * 100:.0f}%" if fraction is not None else "",
                "model": size is nearest,
                "wrong": size.get("correct") is False,
            }
        )
    transports = [
        {"a": t.get("a"), "b": t.get("b"), "via": str(t.get("via") or "")}
        for t in extra.get("transports") or []
        if isinstance(t, dict)
    ]
    status = str(probe.get("status") or "").upper()
    world_size = shape.get("world_size")
    backend = " ".join(str(part) for part in (probe.get("backend"), extra.get("nccl_version")) if part)
    facts = [
        f"{world_size} GPUs" if isinstance(world_size, int) and world_size > 0 else "",
        str(shape.get("dtype") or ""),
        backend,
    ]
    return {
        "run": run,
        "verdict": gpu_selectors.probe_verdict(probe) or "other",
        "status": gpu_figures.probe_status_word(probe),
        "skipped": status == "SKIPPED",
        "error": str(probe.get("error") or ""),
        "facts": [fact for fact in facts if fact],
        "busbw": _gbps_text(probe.get("gbps")),
        "percent": f"{probe['peak_fraction'] * 100:.0f}%" if _number(probe.get("peak_fraction")) else "",
        "link_kind": str(link.get("kind") or ""),
        "link_gbps": _gbps_text(peak),
        "tp_size": gpu_figures.size_text(tp_bytes) if tp_bytes and tp_bytes > 0 else "",
        "rows": rows,
        "transports": transports,
        "fig": gpu_figures.allreduce_figure(probe, link=link, height=height),
        "fig_id": fig_id,
    }

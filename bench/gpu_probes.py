"""The GPU worker's kernel probes against figures measured on one H200.

    python bench/gpu_probes.py                              # inventory + every probe
    python bench/gpu_probes.py gemm_bf16 memory_copy        # only these
    python bench/gpu_probes.py --component attention --json bench/out/gpu_probes.json

Takes the worker's inventory, runs the probes in this process exactly as `python -m worker probe` does,
prints the probe table, then every anchored figure as a speed ratio against its anchor (rate over anchor
rate; anchor time over time, so above 1 is faster) and whether it lies within 10%. The headline is the
probe's short-burst median, timed as the anchors were; the ratio over a ~200 ms run of back-to-back calls
and the SM clock after each follow, since a card at its power limit clocks down under sustained GEMMs. The anchors were
measured on one H200 SXM of the device machine (driver 580, torch 2.11.0+cu130): bf16 GEMM 8192^3 about
790 TFLOP/s, FP8 torch._scaled_mm 8192^3 about 1440 TFLOP/s, device copy about 4.3 TB/s (read + written),
SDPA causal 8x32x4096x128 bf16: cuDNN 1.8 ms, flash 3.3 ms, efficient 6.6 ms, math 104 ms. On another GPU
the ratios only say how far it is from that H200.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT

sys.path.insert(0, str(ROOT))  # the worker package, also where dispatchlab is not installed

from worker.inventory import summary_lines, take_inventory
from worker.probes import DEFAULT_JIT_TIMEOUT_S, ProbeResult, run_probes, table_lines

TOLERANCE = 0.10


@dataclass(frozen=True)
class Anchor:
    probe: str
    field: str  # "tflops", "gbps" or "ms"
    value: float
    unit: str


ANCHORS = [
    Anchor("gemm_bf16", "tflops", 790.0, "TFLOP/s"),
    Anchor("gemm_fp8", "tflops", 1440.0, "TFLOP/s"),
    Anchor("memory_copy", "gbps", 4300.0, "GB/s"),
    Anchor("sdpa_cudnn", "ms", 1.8, "ms"),
    Anchor("sdpa_flash", "ms", 3.3, "ms"),
    Anchor("sdpa_efficient", "ms", 6.6, "ms"),
    Anchor("sdpa_math", "ms", 104.0, "ms"),
]


def compare(results: list[ProbeResult]) -> list[dict[str, object]]:
    by_name = {r.name: r for r in results}
    rows: list[dict[str, object]] = []
    for anchor in ANCHORS:
        result = by_name.get(anchor.probe)
        if result is None:
            continue
        measured = getattr(result, anchor.field)
        row: dict[str, object] = {"probe": anchor.probe, "unit": anchor.unit, "anchor": anchor.value}
        if measured is None:
            row.update(measured=None, ratio=None, within=False, status=str(result.status), error=result.error)
        else:
            ratio = anchor.value / measured if anchor.field == "ms" else measured / anchor.value
            row.update(measured=measured, ratio=round(ratio, 3), within=abs(ratio - 1) <= TOLERANCE)
            sustained = result.extra.get("sustained_ms")
            if sustained and result.ms:  # the same work over a longer run: speed scales with 1 / time
                row["sustained_ratio"] = round(ratio * result.ms / sustained, 3)
                row["sm_clock_mhz"] = result.extra.get("sm_clock_mhz")
                row["sustained_sm_clock_mhz"] = result.extra.get("sustained_sm_clock_mhz")
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME")
    parser.add_argument("--component")
    parser.add_argument("--jit-timeout", type=float, default=DEFAULT_JIT_TIMEOUT_S)
    parser.add_argument("--json", type=Path, help="also write inventory, probes and ratios here")
    args = parser.parse_args()

    inventory = take_inventory()
    print("\n".join(summary_lines(inventory)))
    names = {g.name for g in inventory.gpus}
    if names and not any("H200" in n for n in names):
        print(f"note: the anchors are an H200's; this host has {', '.join(sorted(names))}")
    results = run_probes(args.names or None, component=args.component, jit_timeout_s=args.jit_timeout)
    print()
    print("\n".join(table_lines(results)))
    print()
    rows = compare(results)
    for row in rows:
        anchor = f"anchor {row['anchor']:g} {row['unit']}"
        if row["measured"] is None:
            print(f"{row['probe']:<16} not run ({row['status']}: {row['error']}); {anchor}")
            continue
        verdict = "within 10%" if row["within"] else "NOT within 10%"
        measured = f"{row['measured']:g} {row['unit']}"
        line = f"{row['probe']:<16} {measured:<16} {anchor:<22} speed {row['ratio']:.3f}x  {verdict}"
        if "sustained_ratio" in row:
            line += (
                f"  (SM {row['sm_clock_mhz']} MHz; over ~200 ms: {row['sustained_ratio']:.3f}x,"
                f" SM {row['sustained_sm_clock_mhz']} MHz)"
            )
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "inventory": inventory.to_dict(),
            "probes": [r.to_dict() for r in results],
            "anchors": rows,
        }
        args.json.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

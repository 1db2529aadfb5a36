"""The GPU worker's NCCL all-reduce probe against bus bandwidths measured on the lent 2x H200.

    python bench/allreduce_probe.py                      # inventory, probe, ratios
    python bench/allreduce_probe.py --json bench/out/allreduce.json

Takes the worker's inventory, runs `worker.allreduce.run_allreduce` exactly as `python -m worker probe
allreduce` does (one process per GPU, NCCL, bf16, 5 warm-ups then 20 timed all-reduces per size, NVLink
multicast off), prints its table, then the bus bandwidth at each anchored size as a ratio over the anchor
and whether it lies within 10%. The anchors were measured on the lent `nvidia-h200-x2` machine (2x H200
SXM, NV18, driver 580, torch 2.11 with its NCCL) with a plain torch all-reduce loop, bf16, 20 iterations
after 5 warm-ups, NCCL_NVLS_ENABLE=0: busbw 28 GB/s at 1 MiB, 174 at 8 MiB, 267 at 64 MiB, 303 at 256 MiB,
329 at 1 GiB. On other GPUs or another GPU count the ratios only say how far the host is from that pair.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT

sys.path.insert(0, str(ROOT))  # the worker package, also where dispatchlab is not installed

from worker import allreduce
from worker.inventory import summary_lines, take_inventory
from worker.probes import ProbeResult, table_lines

TOLERANCE = 0.10

# bytes -> bus bandwidth in GB/s on 2x H200 (NV18), plain torch loop.
ANCHORS = {
    1 << 20: 28.0,
    8 << 20: 174.0,
    64 << 20: 267.0,
    256 << 20: 303.0,
    1 << 30: 329.0,
}


def compare(result: ProbeResult) -> list[dict[str, object]]:
    measured = {row["bytes"]: row for row in result.extra.get("sizes") or []}
    rows: list[dict[str, object]] = []
    for nbytes, anchor in ANCHORS.items():
        row: dict[str, object] = {"bytes": nbytes, "anchor_busbw_gbps": anchor}
        size = measured.get(nbytes)
        if size is None:
            row.update(busbw_gbps=None, ratio=None, within=False)
        else:
            ratio = size["busbw_gbps"] / anchor
            row.update(
                busbw_gbps=size["busbw_gbps"], ratio=round(ratio, 3), within=abs(ratio - 1) <= TOLERANCE
            )
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=allreduce.MAX_BYTES)
    parser.add_argument("--timeout", type=float, default=allreduce.DEFAULT_TIMEOUT_S)
    parser.add_argument("--json", type=Path, help="also write inventory, probe and ratios here")
    args = parser.parse_args()

    inventory = take_inventory()
    print("\n".join(summary_lines(inventory)))
    names = sorted({g.name for g in inventory.gpus})
    if names and (len(inventory.gpus) != 2 or not all("H200" in n for n in names)):
        print(
            f"note: the anchors are a pair of H200s'; this host has {len(inventory.gpus)}x {', '.join(names)}"
        )
    result = allreduce.run_allreduce(inventory=inventory, max_bytes=args.max_bytes, timeout_s=args.timeout)
    print()
    print("\n".join(table_lines([result])))
    lines = allreduce.size_table_lines(result)
    if lines:
        print()
        print("\n".join(lines))
    print()
    rows = compare(result)
    for row in rows:
        size = allreduce.human_bytes(int(str(row["bytes"])))
        anchor = f"anchor {row['anchor_busbw_gbps']:g} GB/s"
        if row["busbw_gbps"] is None:
            print(f"{size:>8}  not measured ({result.status}: {result.error}); {anchor}")
            continue
        verdict = "within 10%" if row["within"] else "NOT within 10%"
        measured = f"busbw {row['busbw_gbps']:g} GB/s"
        print(f"{size:>8}  {measured:<20} {anchor:<20} ratio {row['ratio']:.3f}  {verdict}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"inventory": inventory.to_dict(), "probe": result.to_dict(), "anchors": rows}
        args.json.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

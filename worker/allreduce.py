"""The NCCL all-reduce probe: how fast this host's GPUs sum a tensor together, next to the link between them.

One process per GPU (subprocesses of this one, `python -m worker.allreduce`, meeting at
tcp://127.0.0.1:<free port>), torch.distributed with the NCCL backend, bf16. For every size from 1 MiB to
1 GiB (powers of two) and the size a tensor-parallel all-reduce of the model would move (hidden_size x
tokens x 2 bytes), each rank first checks one sum (at element i rank r contributes i % 7 + r + 1: small
integers, exact in bf16, and a misplaced chunk shows), then times 20 all-reduces after 5 warm-ups between
CUDA events; before the sweep, as nccl-tests does, it warms up at the largest and the smallest size. The figures are nccl-tests': algorithm bandwidth = bytes / time, bus bandwidth = algbw x
2(n-1)/n (GB = 1e9 bytes), the time averaged over the ranks; `peak_fraction` is busbw over the datasheet
bandwidth of the slowest link between the GPUs, per direction (worker.inventory; worker.peaks when NVML
names no link).

NVLink multicast (NVLS) stays off in this process and in every rank: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 are forced into the environment before torch
or NCCL start, whatever the caller's environment says: a program that uses multicast can take shared GPUs
out of service. The ranks run with NCCL_DEBUG=INFO into one file each; the transport NCCL chose for every
pair (P2P/CUMEM, P2P/IPC, SHM, NET ...), its version and the NCCL_* settings it saw are read from them.

    run_allreduce(model_shapes=..., inventory=...) -> ProbeResult    never raises for a host that cannot run it

The arithmetic, NCCL's log and the link are worker.probes.communication's (re-exported here); this module
starts the ranks and is one of them (`python -m worker.allreduce`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from worker.inventory import Inventory, take_inventory
from worker.probes import ModelShapes, ProbeResult, ProbeStatus
from worker.probes.communication import (
    BF16_BYTES,
    MAX_BYTES,
    MIN_BYTES,
    Bandwidth,
    NcclLog,
    Transport,
    bus_bandwidth,
    human_bytes,
    link_between,
    message_sizes,
    model_tp_bytes,
    read_nccl_log,
    size_table_lines,
)
from worker.runner import free_port

__all__ = [
    "BACKEND",
    "COMPONENT",
    "DESCRIPTION",
    "MAX_BYTES",
    "MIN_BYTES",
    "MULTICAST_OFF",
    "NAME",
    "Bandwidth",
    "NcclLog",
    "Transport",
    "bus_bandwidth",
    "disable_multicast",
    "human_bytes",
    "link_between",
    "message_sizes",
    "model_tp_bytes",
    "rank_env",
    "read_nccl_log",
    "run_allreduce",
    "size_table_lines",
]

NAME = "allreduce"
BACKEND = "nccl"
COMPONENT = "comm"
DESCRIPTION = "NCCL all-reduce over every GPU, one process each, bf16 1 MiB-1 GiB and the model's TP size"

# Set in this process and every rank before torch or NCCL initialise; nothing may turn them back on.
MULTICAST_OFF: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
NCCL_DEBUG_SUBSYS = "INIT,ENV,GRAPH,NVLS"

WARMUP = 5
ITERS = 20
DEFAULT_TIMEOUT_S = 300.0
_ROOT = Path(__file__).resolve().parents[1]
# How a rank is started; its arguments (--rank, --world-size, --init, --sizes, --warmup, --iters, --out)
# follow. Run from the repository root, with rank_env()'s environment.
RANK_COMMAND: tuple[str, ...] = (sys.executable, "-m", "worker.allreduce")


# ---------------------------------------------------------------- environment


def disable_multicast(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Force NVLink multicast off in `env` (os.environ, or a child's environment) and return it."""
    env.update(MULTICAST_OFF)
    return env


def rank_env(base: Mapping[str, str], *, debug_file: Path | None = None) -> dict[str, str]:
    """The environment of one rank: the caller's, with NCCL's INFO log (into `debug_file` when given),
    CUDA devices numbered as NVML numbers them, and multicast off, applied last so that nothing in `base`
    can turn it on."""
    env = dict(base)
    env.pop("NCCL_DEBUG_FILE", None)
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS=NCCL_DEBUG_SUBSYS, PYTHONUNBUFFERED="1")
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if debug_file is not None:
        env["NCCL_DEBUG_FILE"] = str(debug_file)
    disable_multicast(env)
    return env


# ---------------------------------------------------------------- the probe (parent side)


def run_allreduce(
    *,
    model_shapes: Mapping[str, Any] | None = None,
    inventory: Inventory | None = None,
    world_size: int | None = None,
    max_bytes: int = MAX_BYTES,
    warmup: int = WARMUP,
    iters: int = ITERS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> ProbeResult:
    """All-reduce over `world_size` GPUs (default: every GPU torch sees). Bad model shapes raise
    ValueError before anything runs; otherwise it never raises: a host without two GPUs, torch or NCCL
    gets a SKIPPED / NOT_INSTALLED result with the reason, a failed or stuck rank RUNTIME_ERROR / TIMEOUT."""
    shapes = ModelShapes.from_mapping(model_shapes)
    if iters < 1 or warmup < 0 or max_bytes < MIN_BYTES:
        raise ValueError(f"iters >= 1, warmup >= 0 and max_bytes >= {MIN_BYTES} are needed")
    disable_multicast(os.environ)
    r = ProbeResult(NAME, BACKEND, COMPONENT, shape={"world_size": 0, "dtype": "bf16"})
    tp_bytes = model_tp_bytes(shapes)
    r.extra.update(
        sizes=[],
        model_tp_bytes=tp_bytes,
        model_tp_shape={"hidden_size": shapes.hidden_size, "tokens": shapes.tokens},
        link=None,
        transports=[],
        nccl_version=None,
        multicast_env=dict(MULTICAST_OFF),
    )
    count, unavailable = _gpu_count()
    if unavailable is not None:
        r.status, r.error = unavailable
        return r
    world = min(world_size or count, count)
    if world < 2:
        r.status, r.error = ProbeStatus.SKIPPED, f"world size {world}: an all-reduce needs at least two GPUs"
        return r
    r.shape["world_size"] = world
    inventory = inventory if inventory is not None else take_inventory()
    gpus = _nvml_indices(world)
    first = next((g for g in inventory.gpus if g.index == gpus[0]), None)
    r.gpu, r.arch = (first.name, first.arch) if first else (None, None)
    link = link_between(inventory, gpus)
    r.extra["link"] = link
    r.extra["gpus"] = gpus
    sizes = message_sizes(tp_bytes, max_bytes=max_bytes)
    with tempfile.TemporaryDirectory(prefix="dispatchlab-allreduce-") as tmp:
        launch = _launch(world, sizes, Path(tmp), warmup=warmup, iters=iters, timeout_s=timeout_s)
    log = read_nccl_log(launch.nccl_lines)
    data = launch.data or {}
    r.extra.update(
        transports=[asdict(t) for t in log.transports],
        nccl_version=data.get("nccl_version") or log.version,
        nccl_env=log.env,
        nccl_lines=log.lines,
        multicast_seen=log.multicast,
        torch=data.get("torch"),
        wall_s=round(launch.wall_s, 1),
    )
    if log.warnings:
        r.extra["nccl_warnings"] = log.warnings
    if launch.failure is not None:
        r.status, r.error = launch.failure
        r.error_detail = launch.detail
        return r
    _fill(r, data, world, tp_bytes, link)
    return r


def _gpu_count() -> tuple[int, tuple[ProbeStatus, str] | None]:
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return 0, (ProbeStatus.NOT_INSTALLED, "torch is not installed")
    except Exception as error:
        return 0, (ProbeStatus.RUNTIME_ERROR, f"import torch failed: {_error_line(error)}")
    if getattr(torch.version, "hip", None):
        return 0, (ProbeStatus.SKIPPED, "ROCm GPUs are not probed yet (RCCL)")
    try:
        count = int(torch.cuda.device_count())
    except Exception as error:
        return 0, (ProbeStatus.SKIPPED, f"no GPU: {_error_line(error)}; an all-reduce needs at least two")
    if count == 0:
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU"
        return 0, (ProbeStatus.SKIPPED, f"no GPU: {why}; an all-reduce needs at least two")
    if count == 1:
        return 1, (ProbeStatus.SKIPPED, "1 GPU: an all-reduce needs at least two")
    distributed = getattr(torch, "distributed", None)
    if distributed is None or not distributed.is_available() or not distributed.is_nccl_available():
        return count, (ProbeStatus.NOT_INSTALLED, f"torch {torch.__version__} was built without NCCL")
    return count, None


def _nvml_indices(world: int) -> list[int]:
    """The NVML index of each rank's GPU: rank r runs on CUDA device r, numbered in PCI order
    (CUDA_DEVICE_ORDER=PCI_BUS_ID, as NVML numbers them), through CUDA_VISIBLE_DEVICES where it lists indices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        with contextlib.suppress(ValueError):
            indices = [int(part) for part in visible.split(",") if part.strip()]
            if len(indices) >= world:
                return indices[:world]
    return list(range(world))


@dataclass
class _Launch:
    data: dict[str, Any] | None = None
    failure: tuple[ProbeStatus, str] | None = None
    detail: str | None = None
    nccl_lines: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def _launch(world: int, sizes: list[int], tmp: Path, *, warmup: int, iters: int, timeout_s: float) -> _Launch:
    """Start one rank per GPU, wait for all of them (stopping the rest once one fails or time runs out),
    and collect rank 0's result and every rank's output."""
    port = free_port()
    result_path = tmp / "result.json"
    outputs: list[IO[bytes]] = []
    processes: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    launch = _Launch()
    try:
        for rank in range(world):
            argv = [
                *RANK_COMMAND,
                f"--rank={rank}",
                f"--world-size={world}",
                f"--init=tcp://127.0.0.1:{port}",
                f"--sizes={','.join(map(str, sizes))}",
                f"--warmup={warmup}",
                f"--iters={iters}",
                f"--out={result_path}",
            ]
            output = open(tmp / f"rank{rank}.out", "wb")  # noqa: SIM115 -- closed in finally
            outputs.append(output)
            env = rank_env(os.environ, debug_file=tmp / f"nccl-rank{rank}.log")
            processes.append(
                subprocess.Popen(
                    argv, cwd=_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output
                )
            )
        launch.failure = _wait(processes, started + timeout_s, timeout_s)
    except OSError as error:
        launch.failure = (ProbeStatus.RUNTIME_ERROR, f"a rank could not be started: {_error_line(error)}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for stream in outputs:
            stream.close()
    launch.wall_s = time.monotonic() - started
    rank_text = [_read(tmp / f"rank{rank}.out") for rank in range(world)]
    for rank in range(world):
        launch.nccl_lines += _read(tmp / f"nccl-rank{rank}.log").splitlines() + rank_text[rank].splitlines()
    if launch.failure is not None:
        failed = next((i for i, p in enumerate(processes) if p.returncode not in (0, None, -9)), 0)
        text = rank_text[failed] if failed < len(rank_text) else ""
        if launch.failure[0] == ProbeStatus.RUNTIME_ERROR and text:
            launch.failure = (ProbeStatus.RUNTIME_ERROR, f"rank {failed}: {_last_error(text)}")
        launch.detail = "\n".join(text.splitlines()[-40:])[-4000:] or None
        return launch
    try:
        launch.data = json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        launch.failure = (ProbeStatus.RUNTIME_ERROR, f"rank 0 left no result: {_error_line(error)}")
        launch.detail = "\n".join(rank_text[0].splitlines()[-40:])[-4000:] or None
    return launch


def _wait(
    processes: list[subprocess.Popen[bytes]], deadline: float, timeout_s: float
) -> tuple[ProbeStatus, str] | None:
    while True:
        codes = [p.poll() for p in processes]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            return ProbeStatus.RUNTIME_ERROR, f"rank {rank} exited with status {code}"
        if all(code == 0 for code in codes):
            return None
        if time.monotonic() > deadline:
            return ProbeStatus.TIMEOUT, f"the ranks had not finished after {timeout_s:g} s and were stopped"
        time.sleep(0.2)


def _fill(
    r: ProbeResult, data: Mapping[str, Any], world: int, tp_bytes: int, link: dict[str, Any] | None
) -> None:
    peak = link.get("gbps") if link else None
    rows: list[dict[str, Any]] = []
    wrong: list[str] = []
    for size in data.get("sizes") or []:
        nbytes, ms = int(size["bytes"]), float(size["ms"])
        bw = bus_bandwidth(nbytes, ms / 1e3, world)
        rows.append(
            {
                "bytes": nbytes,
                "ms": round(ms, 4),
                "algbw_gbps": round(bw.algbw_gbps, 1),
                "busbw_gbps": round(bw.busbw_gbps, 1),
                "peak_fraction": round(bw.busbw_gbps / peak, 3) if peak else None,
                "correct": bool(size["correct"]),
                "max_error": size.get("max_error"),
                "ms_max_rank": round(float(size.get("ms_max", ms)), 4),
                "wall_ms": round(float(size.get("wall_ms", 0.0)), 4),
                "model_tp": nbytes == tp_bytes,
            }
        )
        if not size["correct"]:
            wrong.append(human_bytes(nbytes))
    r.extra["sizes"] = rows
    r.checked = bool(rows)
    errors = [float(s.get("max_error") or 0.0) for s in data.get("sizes") or []]
    ratios = [float(s.get("matched_ratio", 1.0)) for s in data.get("sizes") or []]
    r.max_error = max(errors) if errors else None
    r.matched_ratio = min(ratios) if ratios else None
    if not rows:
        r.status, r.error = ProbeStatus.RUNTIME_ERROR, "the ranks reported no size"
        return
    largest = max(rows, key=lambda row: row["bytes"])
    r.ms, r.gbps, r.peak_fraction = largest["ms"], largest["busbw_gbps"], largest["peak_fraction"]
    r.shape["bytes"] = largest["bytes"]
    if wrong:
        r.status = ProbeStatus.INCORRECT_NUMERICAL
        r.error = f"the sum over {world} ranks was wrong at {', '.join(wrong)} (max error {r.max_error})"
    else:
        r.status = ProbeStatus.PASSED


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*")


def _last_error(text: str) -> str:
    """The exception line of a Python traceback (the last one), else the last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (errors[-1] if errors else lines[-1] if lines else "no output")[:500]


def _error_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")[:500]


# ---------------------------------------------------------------- one rank (child side)


def _rank_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.allreduce", description="one rank of the probe")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init", required=True, help="tcp://127.0.0.1:PORT")
    parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--out", type=Path, required=True, help="rank 0 writes its JSON here")
    args = parser.parse_args(argv)
    disable_multicast(os.environ)  # again, before torch: this process may have been started by hand
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")

    rank, world = args.rank, args.world_size
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    options = {"init_method": args.init, "rank": rank, "world_size": world}
    timeout = datetime.timedelta(seconds=120)
    try:
        dist.init_process_group("nccl", timeout=timeout, device_id=device, **options)
    except TypeError:  # torch before 2.3 has no device_id
        dist.init_process_group("nccl", timeout=timeout, **options)
    byte_counts = [int(s) for s in args.sizes.split(",")]
    _warm_up(torch, dist, device, byte_counts, args.warmup)
    sizes = [
        _measure_size(torch, dist, device, nbytes, rank, world, args.warmup, args.iters)
        for nbytes in byte_counts
    ]
    if rank == 0:
        version = torch.cuda.nccl.version()
        document = {
            "world_size": world,
            "nccl_version": ".".join(map(str, version)) if isinstance(version, tuple) else str(version),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device),
            "sizes": sizes,
        }
        args.out.write_text(json.dumps(document), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _warm_up(torch: Any, dist: Any, device: Any, byte_counts: list[int], warmup: int) -> None:
    """As nccl-tests does before its sweep: all-reduces at the largest and the smallest size, so that the
    first size measured does not pay for NCCL's lazy connection setup and idle clocks (seen on 2x H200:
    1 MiB first took 45-64 us an all-reduce, 2 MiB right after it 39-46 us)."""
    for nbytes in (max(byte_counts), min(byte_counts)):
        buffer = torch.zeros(nbytes // BF16_BYTES, device=device, dtype=torch.bfloat16)
        for _ in range(max(warmup, 1)):
            dist.all_reduce(buffer)
        del buffer
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _measure_size(
    torch: Any, dist: Any, device: Any, nbytes: int, rank: int, world: int, warmup: int, iters: int
) -> dict[str, Any]:
    numel = nbytes // BF16_BYTES
    pattern = torch.arange(numel, device=device, dtype=torch.int32).remainder_(7).to(torch.bfloat16)
    buffer = pattern + (rank + 1)
    dist.all_reduce(buffer)
    expected = pattern.mul_(world).add_(world * (world + 1) // 2)  # exact: integers below 256
    max_error = float((buffer - expected).abs().max().item())
    matched = int((buffer == expected).sum().item()) / numel
    del pattern, expected
    for _ in range(warmup):
        dist.all_reduce(buffer)
    torch.cuda.synchronize(device)
    dist.barrier()
    torch.cuda.synchronize(device)
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    begin.record()
    for _ in range(iters):
        dist.all_reduce(buffer)
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - wall) * 1e3 / iters
    ms = begin.elapsed_time(end) / iters
    # Every rank's figures to every rank: nccl-tests averages the time over ranks.
    mine = torch.tensor([ms, wall_ms, max_error, matched], device=device, dtype=torch.float64)
    gathered = torch.empty(world * 4, device=device, dtype=torch.float64)
    dist.all_gather_into_tensor(gathered, mine)
    rows = gathered.view(world, 4).cpu().tolist()
    del buffer
    torch.cuda.empty_cache()
    return {
        "bytes": nbytes,
        "ms": sum(row[0] for row in rows) / world,
        "ms_max": max(row[0] for row in rows),
        "wall_ms": sum(row[1] for row in rows) / world,
        "max_error": max(row[2] for row in rows),
        "matched_ratio": min(row[3] for row in rows),
        "correct": all(row[2] == 0.0 and row[3] == 1.0 for row in rows),
    }


if __name__ == "__main__":
    sys.exit(_rank_main())

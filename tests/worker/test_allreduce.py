"""The NCCL all-reduce probe as a host owner meets it: on this CPU machine it answers, in the probes'
envelope, why it cannot run; its figures are nccl-tests'; NCCL's own log says which transport each pair
used; and no process it starts can have NVLink multicast on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from worker import allreduce
from worker.allreduce import (
    MULTICAST_OFF,
    bus_bandwidth,
    link_between,
    message_sizes,
    model_tp_bytes,
    rank_env,
    read_nccl_log,
    run_allreduce,
)
from worker.inventory import GpuInfo, Inventory, Link
from worker.peaks import link_gbps_per_direction
from worker.probes import ModelShapes, ProbeStatus

ROOT = Path(__file__).resolve().parents[2]
MiB, GiB = 1 << 20, 1 << 30


def worker_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def two_h200s(links: bool = True) -> Inventory:
    gpus = [GpuInfo(i, "NVIDIA H200", "sm_90", 143771, nvlinks=18) for i in range(2)]
    nv18 = Link(0, 1, "NV18", 450.0, transport="nvlink", nvlink_gen=4, lanes=18, switched=True, p2p=True)
    return Inventory(gpus=gpus, links=[nv18] if links else [])


# ---------------------------------------------------------------- on a host that cannot run it


def test_probe_allreduce_json_answers_skipped_without_a_gpu_in_the_probes_envelope():
    done = worker_cli("probe", "allreduce", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # stdout holds the JSON alone
    assert set(data) == {"host", "probes"}
    assert set(data["host"]) >= {"gpus", "links", "driver", "versions", "reason"}
    (probe,) = data["probes"]
    assert (probe["name"], probe["backend"], probe["component"]) == ("allreduce", "nccl", "comm")
    assert probe["runs"] is False and probe["status"] == "SKIPPED"
    assert probe["error"].startswith("no GPU: ")
    assert probe["error"].endswith("an all-reduce needs at least two")
    assert probe["gbps"] is None and probe["peak_fraction"] is None
    assert probe["shape"] == {"world_size": 0, "dtype": "bf16"}
    extra = probe["extra"]
    assert extra["sizes"] == [] and extra["transports"] == [] and extra["link"] is None
    assert extra["model_tp_bytes"] == 7168 * 4096 * 2  # DeepSeek-like hidden size x tokens, bf16
    assert extra["multicast_env"] == dict(MULTICAST_OFF)


def test_the_model_tp_size_follows_the_model_shapes_option_and_variable():
    shapes = '{"hidden_size": 4096, "tokens": 8192}'
    by_option = json.loads(worker_cli("probe", "allreduce", "--json", "--model-shapes", shapes).stdout)
    assert by_option["probes"][0]["extra"]["model_tp_bytes"] == 4096 * 8192 * 2
    env = dict(os.environ, DISPATCHLAB_PROBE_MODEL_SHAPES='{"hidden_size": 2048, "num_tokens": 16}')
    by_variable = json.loads(worker_cli("probe", "allreduce", "--json", env=env).stdout)
    assert by_variable["probes"][0]["extra"]["model_tp_shape"] == {"hidden_size": 2048, "tokens": 16}


def test_allreduce_is_named_listed_and_mixed_but_never_run_by_default():
    listing = worker_cli("probe", "--list")
    line = next(line for line in listing.stdout.splitlines() if line.startswith("allreduce "))
    assert line.split()[1:3] == ["comm", "nccl"]
    mixed = json.loads(worker_cli("probe", "allreduce", "gemm_bf16", "--json").stdout)
    assert [p["name"] for p in mixed["probes"]] == ["gemm_bf16", "allreduce"]
    by_component = json.loads(worker_cli("probe", "--component", "comm", "--json").stdout)
    assert [p["name"] for p in by_component["probes"]] == ["allreduce"]
    unknown = worker_cli("probe", "allreduse")
    assert unknown.returncode == 2
    assert "unknown probe allreduse" in unknown.stderr and "allreduce" in unknown.stderr.split(": one of ")[1]


def test_probe_allreduce_for_people_is_a_table_with_the_reason():
    done = worker_cli("probe", "allreduce")
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("allreduce"))
    assert row.split()[1:3] == ["nccl", "SKIPPED"]
    assert "an all-reduce needs at least two" in row


def fake_torch(gpus: int, *, nccl: bool = True) -> SimpleNamespace:
    distributed = SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: nccl)
    return SimpleNamespace(
        __version__="2.11.0+cu130",
        version=SimpleNamespace(cuda="13.0", hip=None),
        cuda=SimpleNamespace(device_count=lambda: gpus),
        distributed=distributed,
    )


def test_one_gpu_is_skipped_because_an_all_reduce_needs_two(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(1))
    result = run_allreduce(inventory=Inventory())
    assert (result.status, result.error) == (ProbeStatus.SKIPPED, "1 GPU: an all-reduce needs at least two")
    assert result.to_dict()["runs"] is False


def test_torch_without_nccl_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(2, nccl=False))
    result = run_allreduce(inventory=two_h200s())
    assert result.status == ProbeStatus.NOT_INSTALLED
    assert result.error == "torch 2.11.0+cu130 was built without NCCL"


def test_bad_model_shapes_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="hidden_size"):
        run_allreduce(model_shapes={"hidden_size": 0})


# ---------------------------------------------------------------- nccl-tests' arithmetic


def test_bus_bandwidth_is_nccl_tests_algbw_times_2_n_minus_1_over_n():
    # A row as nccl-tests prints it for 8 ranks: 134217728 B in 1231.1 us -> algbw 109.02, busbw 190.79.
    row = bus_bandwidth(134217728, 1231.1e-6, 8)
    assert round(row.algbw_gbps, 2) == 109.02
    assert round(row.busbw_gbps, 2) == 190.79
    # Two ranks move the whole buffer once each way: busbw equals algbw (1 GiB in 3.2356 ms on 2x H200).
    pair = bus_bandwidth(GiB, 3.2356e-3, 2)
    assert round(pair.algbw_gbps, 1) == round(pair.busbw_gbps, 1) == 331.9
    assert bus_bandwidth(MiB, 1e-3, 4).busbw_gbps == pytest.approx(MiB / 1e-3 / 1e9 * 1.5)
    assert bus_bandwidth(MiB, 1e-3, 1).busbw_gbps == 0.0  # one rank moves nothing over a link


def test_bus_bandwidth_refuses_nonsense():
    with pytest.raises(ValueError, match="time"):
        bus_bandwidth(MiB, 0.0, 2)
    with pytest.raises(ValueError, match="world size"):
        bus_bandwidth(MiB, 1.0, 0)


def test_sizes_run_from_1_mib_to_1_gib_with_the_model_tp_size_in_its_place():
    tp = model_tp_bytes(ModelShapes())
    assert tp == 58720256  # 56 MiB
    sizes = message_sizes(tp)
    assert sizes[0] == MiB and sizes[-1] == GiB and len(sizes) == 12
    assert sizes == sorted(sizes) and tp in sizes
    assert message_sizes(64 * MiB) == message_sizes(None)  # a power of two is not measured twice
    assert message_sizes(None, max_bytes=4 * MiB) == [MiB, 2 * MiB, 4 * MiB]


# ---------------------------------------------------------------- NCCL's INFO log

# Lines in the format NCCL's src/transport/{p2p,shm,net}.cc and init.cc print them: "<host>:<pid>:<tid>
# [<cudaDev>] NCCL INFO ...". The first three were printed by NCCL 2.28.9 on the lent 2x H200.
H200_LINES = """\
vm:616:616 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:616:616 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:616:616 [0] NCCL INFO Channel 00/24 : 0 1
vm:616:616 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
vm:616:616 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM
vm:617:617 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM
vm:617:617 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM
vm:616:616 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""


def test_the_transport_of_each_pair_is_read_from_nccls_channel_lines():
    log = read_nccl_log(H200_LINES.splitlines())
    assert log.version == "2.28.9+cuda13.0"
    assert log.env == {"NCCL_NVLS_ENABLE": "0"}
    assert log.multicast is False
    assert [(t.a, t.b, t.via, t.kind, t.channels) for t in log.transports] == [
        (0, 1, "P2P/CUMEM", "P2P", 2),
        (1, 0, "P2P/CUMEM", "P2P", 2),
    ]
    assert log.lines[0] == "vm:616:616 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("gpu-7:4021:4087 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", (0, 1, "P2P/CUMEM/read")),
        ("gpu-7:4021:4087 [2] NCCL INFO Channel 03/1 : 2[2] -> 3[3] via P2P/IPC/read", (2, 3, "P2P/IPC/read")),
        ("gpu-7:4021:4087 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer", (0, 1, "P2P/direct pointer")),
        ("gpu-7:4021:4087 [0] NCCL INFO Channel 02/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read", (0, 2, "P2P/indirect/1[1]/read")),
        ("gpu-7:4021:4087 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct", (1, 0, "SHM/direct/direct")),
        ("gpu-7:4021:4087 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0", (0, 8, "NET/Socket/0")),
        ("gpu-9:5120:5188 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/IB/0/GDRDMA", (0, 8, "NET/IB/0/GDRDMA")),
        ("[2026-11-20 10:00:00] gpu-7:4021:4087 [0] NCCL INFO Channel 00 : 0[18000] -> 1[2a000] via P2P/IPC", (0, 1, "P2P/IPC")),
    ],
)  # fmt: skip
def test_every_transport_format_ncc_prints_is_understood(line, expected):
    (transport,) = read_nccl_log([line + "\n"]).transports
    assert (transport.a, transport.b, transport.via) == expected
    assert transport.kind == expected[2].split("/")[0]


def test_network_lines_keep_their_direction_and_old_bus_ids_their_device():
    log = read_nccl_log(
        [
            "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
            "h:1:2 [0] NCCL INFO Channel 00 : 0[18000] -> 1[2a000] via P2P/IPC",
        ]
    )
    assert log.transports[0].direction == "send"
    assert (log.transports[1].a_dev, log.transports[1].b_dev) == ("18000", "2a000")


def test_multicast_is_noticed_when_nccl_reports_it_and_not_when_it_declines():
    declined = "h:1:2 [0] NCCL INFO NVLS multicast support is not available on dev 0"
    assert read_nccl_log([declined]).multicast is False
    assert read_nccl_log(["h:1:2 [0] NCCL INFO NVLS multicast support is available on dev 0"]).multicast
    created = "h:1:2 [0] NCCL INFO NVLS Created Multicast group 1f2e nranks 8 size 1073741824 on rank 0"
    assert read_nccl_log([created]).multicast


def test_nccl_warnings_are_kept():
    log = read_nccl_log(["h:1:2 [1] enqueue.cc:1565 NCCL WARN Cuda failure 'out of memory'"])
    assert log.warnings == ["Cuda failure 'out of memory'"]
    assert log.transports == []


# ---------------------------------------------------------------- the link it is compared with


def test_the_peak_is_the_inventorys_link_else_the_datasheet_halved():
    assert link_between(two_h200s(), [0, 1])["gbps"] == 450.0
    fallback = link_between(two_h200s(links=False), [0, 1])
    assert fallback is not None
    assert fallback["gbps"] == 450.0 == link_gbps_per_direction("NVIDIA H200")
    assert "halved" in fallback["source"]
    assert link_between(Inventory(), [0, 1]) is None


# ---------------------------------------------------------------- the ranks it starts

# Stands in for `python -m worker.allreduce`: records its environment, prints NCCL-like lines into
# NCCL_DEBUG_FILE and, as rank 0, reports each size at 300 GB/s (or fails, hangs, sums wrong).
FAKE_RANK = textwrap.dedent(
    """
    import argparse, json, os, sys, time
    parser = argparse.ArgumentParser()
    for name in ("--rank", "--world-size", "--warmup", "--iters"):
        parser.add_argument(name, type=int)
    for name in ("--init", "--sizes", "--out"):
        parser.add_argument(name)
    args = parser.parse_args()
    record = os.environ["FAKE_RANK_DIR"]
    with open(os.path.join(record, f"rank{args.rank}.json"), "w") as f:
        json.dump({"env": dict(os.environ), "argv": sys.argv[1:]}, f)
    behaviour = os.environ.get("FAKE_RANK_BEHAVIOUR", "pass")
    peer = 1 - args.rank
    with open(os.environ["NCCL_DEBUG_FILE"], "w") as log:
        log.write(f"h:9:9 [{args.rank}] NCCL INFO NCCL version 2.28.9+cuda13.0\\n")
        log.write(f"h:9:9 [{args.rank}] NCCL INFO Channel 00/0 : {args.rank}[{args.rank}] -> {peer}[{peer}] via P2P/CUMEM\\n")
    if behaviour == "hang" or (behaviour == "fail" and args.rank == 0):
        time.sleep(60)
    if behaviour == "fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled cuda error", file=sys.stderr)
        sys.exit(1)
    if args.rank == 0:
        sizes = [
            {"bytes": int(b), "ms": int(b) / 300e9 * 1e3, "correct": behaviour != "wrong" or i > 0,
             "max_error": 0.0 if behaviour != "wrong" or i > 0 else 2.0, "matched_ratio": 1.0}
            for i, b in enumerate(args.sizes.split(","))
        ]
        with open(args.out, "w") as f:
            json.dump({"nccl_version": "2.28.9", "torch": "2.11.0+cu130", "sizes": sizes}, f)
    """
)


@pytest.fixture
def fake_ranks(tmp_path, monkeypatch):
    script = tmp_path / "fake_rank.py"
    script.write_text(FAKE_RANK, encoding="utf-8")
    record = tmp_path / "ranks"
    record.mkdir()
    monkeypatch.setattr(allreduce, "RANK_COMMAND", (sys.executable, str(script)))
    monkeypatch.setattr(allreduce, "_gpu_count", lambda: (2, None))
    monkeypatch.setenv("FAKE_RANK_DIR", str(record))
    for name in MULTICAST_OFF:  # restored after the test, whatever the probe sets
        monkeypatch.setenv(name, "1" if name == "NCCL_NVLS_ENABLE" else "0")
    return record


def test_every_rank_starts_with_multicast_off_even_when_the_caller_turned_it_on(fake_ranks, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    result = run_allreduce(
        inventory=two_h200s(), max_bytes=2 * MiB, model_shapes={"hidden_size": 8, "tokens": 8}
    )
    assert result.status == ProbeStatus.PASSED, result.error
    for rank in (0, 1):
        seen = json.loads((fake_ranks / f"rank{rank}.json").read_text())
        env = seen["env"]
        assert {name: env[name] for name in MULTICAST_OFF} == {
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1",
        }
        assert env["NCCL_DEBUG"] == "INFO" and "INIT" in env["NCCL_DEBUG_SUBSYS"]
        assert env["NCCL_DEBUG_FILE"].endswith(f"nccl-rank{rank}.log")
        assert f"--rank={rank}" in seen["argv"] and "--world-size=2" in seen["argv"]
    assert {name: os.environ[name] for name in MULTICAST_OFF} == dict(MULTICAST_OFF)  # this process too


def test_rank_env_puts_multicast_off_last():
    env = rank_env({"NCCL_NVLS_ENABLE": "1", "NVSHMEM_DISABLE_NVLS": "0", "NCCL_DEBUG_FILE": "/x"})
    assert {name: env[name] for name in MULTICAST_OFF} == dict(MULTICAST_OFF)
    assert "NCCL_DEBUG_FILE" not in env and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_run_reports_busbw_per_size_against_the_link_and_the_transports(fake_ranks):
    result = run_allreduce(
        inventory=two_h200s(), max_bytes=4 * MiB, model_shapes={"hidden_size": 512, "tokens": 3072}
    )
    data = result.to_dict()
    assert (data["status"], data["runs"], data["gpu"], data["arch"]) == (
        "PASSED",
        True,
        "NVIDIA H200",
        "sm_90",
    )
    extra = data["extra"]
    assert [s["bytes"] for s in extra["sizes"]] == [MiB, 2 * MiB, 3 * MiB, 4 * MiB]
    assert [s["model_tp"] for s in extra["sizes"]] == [False, False, True, False]
    for size in extra["sizes"]:
        assert set(size) >= {"bytes", "ms", "algbw_gbps", "busbw_gbps", "peak_fraction", "correct"}
        assert size["busbw_gbps"] == size["algbw_gbps"] == 300.0  # two ranks
        assert size["peak_fraction"] == round(300 / 450, 3)
    assert (data["gbps"], data["peak_fraction"], data["shape"]) == (
        300.0,
        0.667,
        {"world_size": 2, "dtype": "bf16", "bytes": 4 * MiB},
    )
    assert extra["link"]["kind"] == "NV18" and extra["link"]["gbps"] == 450.0
    assert [(t["a"], t["b"], t["via"]) for t in extra["transports"]] == [
        (0, 1, "P2P/CUMEM"),
        (1, 0, "P2P/CUMEM"),
    ]
    assert extra["nccl_version"] == "2.28.9" and extra["multicast_seen"] is False
    assert extra["model_tp_bytes"] == 512 * 3072 * 2
    lines = allreduce.size_table_lines(result)
    assert any(line.strip().startswith("3 MiB (TP)") for line in lines)
    assert "link GPU 0 <-> GPU 1: NV18, 450 GB/s per direction" in lines


def test_a_wrong_sum_is_incorrect_numerical(fake_ranks, monkeypatch):
    monkeypatch.setenv("FAKE_RANK_BEHAVIOUR", "wrong")
    result = run_allreduce(
        inventory=two_h200s(), max_bytes=2 * MiB, model_shapes={"hidden_size": 512, "tokens": 1024}
    )
    assert result.status == ProbeStatus.INCORRECT_NUMERICAL
    assert result.error == "the sum over 2 ranks was wrong at 1 MiB (max error 2.0)"
    assert result.runs is True


def test_a_failing_rank_stops_the_others_and_names_its_error(fake_ranks, monkeypatch):
    monkeypatch.setenv("FAKE_RANK_BEHAVIOUR", "fail")
    result = run_allreduce(inventory=two_h200s(), max_bytes=MiB, timeout_s=30)
    assert result.status == ProbeStatus.RUNTIME_ERROR
    assert result.error.startswith("rank 1: torch.distributed.DistBackendError: NCCL error in:")
    assert result.extra["wall_s"] < 20  # rank 0 (asleep) was stopped, not waited for
    assert "Traceback" in (result.error_detail or "")


def test_ranks_that_hang_are_stopped_at_the_timeout(fake_ranks, monkeypatch):
    monkeypatch.setenv("FAKE_RANK_BEHAVIOUR", "hang")
    result = run_allreduce(inventory=two_h200s(), max_bytes=MiB, timeout_s=1.5)
    assert result.status == ProbeStatus.TIMEOUT
    assert result.error == "the ranks had not finished after 1.5 s and were stopped"
    assert result.extra["transports"]  # what NCCL said before it hung is still there

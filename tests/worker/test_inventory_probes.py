"""The GPU worker's inventory and kernel probes as a host owner sees them: on this CPU-only machine
nothing can run, and every command still answers, with JSON in the contract's shape and a reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker import probes
from worker.inventory import INSTALL_HINT, take_inventory
from worker.peaks import peak_for
from worker.probes import Probe, ProbeResult, ProbeStatus, probe_names, probes_for_component, run_probes

ROOT = Path(__file__).resolve().parents[2]
NOT_RUN = {"NOT_INSTALLED", "SKIPPED"}


def worker_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


# ---------------------------------------------------------------- a fake NVML


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """Just enough of pynvml to describe a host: GPUs with their NVLink links (to an NVSwitch, or to a
    peer GPU's bus id) and PCIe paths between them."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus: list[dict[str, Any]], topology: dict[tuple[int, int], int]) -> None:
        self.gpus, self.topology = gpus, topology

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.133.20"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h]["name"].encode()  # older pynvml answers bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.gpus[h]["cc"]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.gpus[h]["mib"] << 20)

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.gpus[h]["bus"])

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return 1980 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 345 if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        raise FakeNVMLError("Not Supported")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 1  # idle links train down

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h]["pcie_gen"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self.gpus[h]["nvlinks"]
        if not links:
            raise FakeNVMLError("Not Supported")
        return 1 if link < len(links) else 0

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        return self.gpus[h].get("nvlink_version", 4)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return 2 if self.gpus[h]["nvlinks"][link] == "switch" else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.gpus[h]["nvlinks"][link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.topology[(a, b)]


class FakeNVMLWithP2P(FakeNVML):
    """A driver that also answers nvmlDeviceGetP2PStatus (0 = OK): read access between every pair, NVLink
    access between the pairs in `nvlink_pairs`."""

    def __init__(self, *args: Any, nvlink_pairs: set[tuple[int, int]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nvlink_pairs = nvlink_pairs

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        if index == 0:  # NVML_P2P_CAPS_INDEX_READ
            return 0
        return 0 if index == 2 and (a, b) in self.nvlink_pairs else 4  # 4: NVML_P2P_STATUS_NOT_SUPPORTED


def hgx_with_an_l40s() -> FakeNVML:
    h100 = {
        "name": "NVIDIA H100 80GB HBM3",
        "cc": (9, 0),
        "mib": 81559,
        "pcie_gen": 5,
        "nvlinks": ["switch"] * 18,
    }
    return FakeNVML(
        [
            {**h100, "bus": "00000000:18:00.0"},
            {**h100, "bus": "00000000:2A:00.0"},
            {
                "name": "NVIDIA L40S",
                "cc": (8, 9),
                "mib": 46068,
                "pcie_gen": 4,
                "bus": "00000000:9A:00.0",
                "nvlinks": [],
            },
        ],
        topology={(0, 1): 30, (0, 2): 50, (1, 2): 50},
    )


# ---------------------------------------------------------------- inventory


def test_without_pynvml_the_inventory_is_empty_and_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    data = take_inventory().to_dict()
    assert data["gpus"] == [] and data["links"] == []
    assert data["reason"] == INSTALL_HINT == "pynvml is not installed: pip install 'dispatchlab[gpu]'"
    assert data["driver"] is None
    assert data["queues"] == ["gpu"]
    assert set(data["versions"]) >= {
        "sglang",
        "vllm",
        "flashinfer",
        "sgl-kernel",
        "torch",
        "triton",
        "nvidia-ml-py",
    }


def test_without_a_driver_the_inventory_names_the_nvml_error(monkeypatch):
    def refuse() -> None:
        raise FakeNVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(NVMLError=FakeNVMLError, nvmlInit=refuse))
    inventory = take_inventory()
    assert inventory.gpus == []
    assert inventory.reason == "no NVIDIA driver: Driver Not Loaded"


def test_nvswitched_h100s_are_nv18_and_a_pcie_card_beside_them_is_sys(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", hgx_with_an_l40s())
    data = json.loads(json.dumps(take_inventory().to_dict()))
    first, _, l40s = data["gpus"]
    assert first["name"] == "NVIDIA H100 80GB HBM3"
    assert (first["arch"], first["capability"], first["memory_mib"]) == ("sm_90", "9.0", 81559)
    assert (first["nvlinks"], first["sm_clock_max_mhz"], first["pcie_max_gen"]) == (18, 1980, 5)
    assert first["power_limit_w"] is None  # not supported on this GPU: null, not a crash
    assert (l40s["arch"], l40s["nvlinks"]) == ("sm_89", 0)
    # gbps: datasheet GB/s per direction (H100 SXM: 900 GB/s both ways over 18 links; PCIe 4.0 x16 ~31.5).
    assert [(link["a"], link["b"], link["kind"], link["gbps"]) for link in data["links"]] == [
        (0, 1, "NV18", 450.0),
        (0, 2, "SYS", 31.5),
        (1, 2, "SYS", 31.5),
    ]
    nvlink, pcie = data["links"][0], data["links"][1]
    assert nvlink == {
        "a": 0,
        "b": 1,
        "kind": "NV18",
        "gbps": 450.0,
        "transport": "nvlink",
        "nvlink_gen": 4,
        "lanes": 18,
        "pcie_gen": None,
        "switched": True,
        "p2p": None,  # this fake driver does not answer nvmlDeviceGetP2PStatus
        "gbps_bidirectional": 900.0,
        "source": "NVIDIA datasheet, per direction: 18 NVLink4 links x 25 GB/s",
    }
    assert (pcie["transport"], pcie["pcie_gen"], pcie["lanes"], pcie["gbps_bidirectional"]) == (
        "pcie",
        4,
        16,
        63.0,
    )
    assert pcie["source"] == "PCIe 4.0 x16 signalling after encoding, per direction (PCI-SIG)"
    assert (data["driver"], data["cuda_version"], data["reason"]) == ("570.133.20", "12.8", None)
    assert data["queues"] == ["gpu", "gpu.sm_89", "gpu.sm_90"]


def test_gpus_linked_directly_count_each_link_once(monkeypatch):
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "cc": (8, 0), "mib": 81920, "pcie_gen": 4}
    nvml = FakeNVML(
        [
            {**a100, "bus": "00000000:07:00.0", "nvlinks": ["00000000:0A:00.0"] * 4},
            {**a100, "bus": "00000000:0A:00.0", "nvlinks": ["00000000:07:00.0"] * 4},
        ],
        topology={(0, 1): 10},
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    (link,) = take_inventory().links
    assert (link.a, link.b, link.kind, link.gbps, link.switched) == (0, 1, "NV4", 100.0, False)
    assert (link.nvlink_gen, link.lanes, link.gbps_bidirectional) == (3, 4, 200.0)


def two_h200s(**kwargs: Any) -> FakeNVML:
    """The lent nvidia-h200-x2 machine as driver 580 describes it: two H200s of an NVSwitch board, each
    with 18 active NVLink4 links (nvmlNvlinkVersion_t 6 = NVLink 4.0), PCIe 5.0 x16."""
    h200 = {"name": "NVIDIA H200", "cc": (9, 0), "mib": 143771, "pcie_gen": 5, "nvlink_version": 6}
    gpus = [
        {**h200, "bus": "00000000:00:06.0", "nvlinks": ["switch"] * 18},
        {**h200, "bus": "00000000:00:07.0", "nvlinks": ["switch"] * 18},
    ]
    return FakeNVMLWithP2P(gpus, topology={(0, 1): 50}, **kwargs)


def test_two_h200s_on_nvswitch_are_nv18_at_450_gb_per_direction_as_nvidia_smi_topo_says(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", two_h200s(nvlink_pairs={(0, 1)}))
    inventory = take_inventory()
    assert [g.nvlink_version for g in inventory.gpus] == [6, 6]
    assert json.loads(json.dumps(inventory.to_dict()))["links"] == [
        {
            "a": 0,
            "b": 1,
            "kind": "NV18",
            "gbps": 450.0,
            "transport": "nvlink",
            "nvlink_gen": 4,
            "lanes": 18,
            "pcie_gen": None,
            "switched": True,
            "p2p": True,
            "gbps_bidirectional": 900.0,
            "source": "NVIDIA datasheet, per direction: 18 NVLink4 links x 25 GB/s",
        }
    ]
    from worker.inventory import summary_lines

    assert "GPU 0 <-> GPU 1: NV18 ~450 GB/s per direction, P2P" in summary_lines(inventory)


def test_a_driver_that_names_no_remote_device_still_finds_nvlink_through_p2p_status(monkeypatch):
    nvml = two_h200s(nvlink_pairs={(0, 1)})
    monkeypatch.setattr(type(nvml), "nvmlDeviceGetNvLinkRemoteDeviceType", None, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    (link,) = take_inventory().links
    assert (link.kind, link.gbps, link.switched) == ("NV18", 450.0, False)


def test_gpus_without_nvlink_between_them_get_their_pcie_path_and_p2p_verdict(monkeypatch):
    pro6000 = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "cc": (12, 0), "mib": 97887}
    nvml = FakeNVMLWithP2P(
        [
            {**pro6000, "pcie_gen": 5, "bus": "00000000:17:00.0", "nvlinks": []},
            {**pro6000, "pcie_gen": 5, "bus": "00000000:65:00.0", "nvlinks": []},
        ],
        topology={(0, 1): 40},
        nvlink_pairs=set(),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    (link,) = take_inventory().links
    assert (link.kind, link.transport, link.gbps, link.pcie_gen, link.lanes) == ("NODE", "pcie", 63.0, 5, 16)
    assert link.p2p is True and link.nvlink_gen is None


def test_a_host_with_one_gpu_lists_no_links(monkeypatch):
    nvml = two_h200s(nvlink_pairs=set())
    nvml.gpus = nvml.gpus[:1]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inventory = take_inventory()
    assert len(inventory.gpus) == 1
    assert inventory.to_dict()["links"] == []


def test_python_m_worker_inventory_json_exits_0_with_the_contract_shape():
    done = worker_cli("inventory", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) >= {"gpus", "links", "driver", "versions", "reason", "hostname", "queues"}
    if not data["gpus"]:  # this machine: no GPU, so the reason says why
        assert data["links"] == [] and data["reason"]


def test_python_m_worker_alone_prints_the_inventory_for_people():
    done = worker_cli()
    assert done.returncode == 0, done.stderr
    assert "queues: gpu" in done.stdout
    assert not done.stdout.lstrip().startswith("{")


# ---------------------------------------------------------------- probes on a host that cannot run them


def test_probe_json_lists_every_probe_as_not_run_with_a_reason():
    done = worker_cli("probe", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # stdout holds the JSON alone
    assert set(data["host"]) >= {"gpus", "versions", "reason"}
    assert [p["name"] for p in data["probes"]] == probe_names()
    for probe in data["probes"]:
        assert probe["runs"] is False
        assert probe["status"] in NOT_RUN
        assert probe["error"]
        assert {"backend", "component", "max_error", "ms", "tflops", "gbps", "peak_fraction"} <= set(probe)


def test_probe_names_a_subset_and_a_component_and_prints_a_table_for_people():
    done = worker_cli("probe", "gemm_bf16", "sdpa_math")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:3] == ["probe", "backend", "status"]
    table = lines[2 : lines.index("")]  # then a blank line and what the host says of FlashInfer's kernels
    assert [line.split()[0] for line in table] == ["gemm_bf16", "sdpa_math"]
    assert lines[lines.index("") + 1].startswith("FlashInfer download-at-first-use kernels:")
    attention = worker_cli("probe", "--json", "--component", "attention")
    assert [p["name"] for p in json.loads(attention.stdout)["probes"]] == probes_for_component("attention")


def test_an_unknown_probe_or_bad_shape_is_a_usage_error():
    unknown = worker_cli("probe", "gemm_bf17")
    assert unknown.returncode == 2
    assert "unknown probe gemm_bf17" in unknown.stderr
    bad = worker_cli("probe", "--model-shapes", '{"top_k": 0}')
    assert bad.returncode == 2
    assert "top_k" in bad.stderr


def test_probe_names_and_components_cover_every_kernel_family():
    names = probe_names()
    assert {"gemm_bf16", "gemm_fp8", "gemm_mxfp4", "memory_copy", "triton_matmul", "moe_grouped_mm"} <= set(
        names
    )
    assert {"sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math"} <= set(
        probes_for_component("attention")
    )
    assert {"flashinfer_cutlass_moe", "flashinfer_trtllm_moe_fp4"} <= set(probes_for_component("moe"))
    by_component = [n for c in ("gemm", "attention", "moe", "memory", "jit") for n in probes_for_component(c)]
    assert sorted(by_component) == sorted(names)  # each probe in exactly one component
    with pytest.raises(ValueError, match="unknown component"):
        probes_for_component("network")


def test_model_shapes_take_hugging_face_names_and_refuse_nonsense():
    shapes = probes.ModelShapes.from_mapping(
        {"n_routed_experts": 64, "num_experts_per_tok": 6, "hidden_size": 2048}
    )
    assert (shapes.num_experts, shapes.top_k, shapes.hidden_size, shapes.tokens) == (64, 6, 2048, 4096)
    with pytest.raises(ValueError, match="top_k"):
        run_probes(["moe_grouped_mm"], model_shapes={"top_k": -1})


# ---------------------------------------------------------------- how failures are reported


def fake_gpu(capability: tuple[int, int]) -> Any:
    """A context that looks like a GPU of this capability, so the probe functions themselves run."""
    healthy = SimpleNamespace(add_=lambda _: SimpleNamespace(item=lambda: 2.0))
    torch = SimpleNamespace(
        cuda=SimpleNamespace(synchronize=lambda: None, empty_cache=lambda: None), ones=lambda *a, **k: healthy
    )
    arch = f"sm_{capability[0]}{capability[1]}"
    return lambda shapes, timeout: probes.Context(
        torch=torch, gpu="NVIDIA H200", arch=arch, capability=capability, shapes=shapes, jit_timeout_s=timeout
    )


def raising(message: str, kind: type[Exception] = RuntimeError) -> Any:
    def probe(ctx: Any, r: ProbeResult) -> None:
        r.shape = {"m": 8}
        raise kind(message)

    return probe


def test_each_failure_is_classified_and_the_other_probes_still_run(monkeypatch):
    def passes(ctx: Any, r: ProbeResult) -> None:
        r.ms, r.tflops, r.max_error = 1.0, 790.0, float("nan")
        r.checked, r.status = True, ProbeStatus.PASSED

    fakes = [
        Probe(
            "no_image",
            "cublas",
            probes.Component.GEMM,
            "",
            raising("CUDA error: no kernel image is available"),
        ),
        Probe(
            "oom",
            "torch",
            probes.Component.MEMORY,
            "",
            raising("CUDA out of memory. Tried to allocate 8.00 GiB"),
        ),
        Probe(
            "ptxas",
            "triton",
            probes.Component.JIT,
            "",
            raising("Ninja build failed.\nnvcc error : 'cicc' died"),
        ),
        Probe("fine", "torch", probes.Component.GEMM, "", passes),
    ]
    monkeypatch.setattr(probes, "PROBES", {p.name: p for p in fakes})
    monkeypatch.setattr(probes, "open_context", fake_gpu((9, 0)))
    results = {r.name: r.to_dict() for r in run_probes()}
    assert results["no_image"]["status"] == "UNSUPPORTED_ARCH"
    assert results["no_image"]["error"] == "RuntimeError: CUDA error: no kernel image is available"
    assert results["no_image"]["shape"] == {"m": 8} and results["no_image"]["arch"] == "sm_90"
    assert results["oom"]["status"] == "RUNTIME_ERROR"
    assert results["ptxas"]["status"] == "COMPILE_ERROR"
    assert (
        results["ptxas"]["error"] == "RuntimeError: Ninja build failed."
    )  # the first line; the rest in detail
    assert "cicc" in results["ptxas"]["error_detail"]
    assert results["fine"]["status"] == "PASSED" and results["fine"]["runs"] is True
    assert results["fine"]["max_error"] is None  # NaN is not JSON


def test_a_kernel_refused_below_its_arch_is_unsupported_arch_and_a_failed_download_is_missing_artifacts(
    monkeypatch,
):
    fakes = [
        Probe(
            "fp4",
            "cublaslt",
            probes.Component.GEMM,
            "",
            raising("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"),
            min_capability=(10, 0),
        ),
        Probe(
            "trtllm",
            "flashinfer_trtllm",
            probes.Component.MOE,
            "",
            raising("Failed to get checksums.txt from ccae3ed/batched_gemm/checksums.txt", AssertionError),
            capabilities=frozenset({(10, 0)}),
        ),
    ]
    monkeypatch.setattr(probes, "PROBES", {p.name: p for p in fakes})
    monkeypatch.setattr(probes, "open_context", fake_gpu((9, 0)))
    fp4, trtllm = run_probes()
    assert fp4.status == ProbeStatus.UNSUPPORTED_ARCH
    assert fp4.error == "RuntimeError: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul"
    assert trtllm.status == ProbeStatus.MISSING_ARTIFACTS
    assert trtllm.error.startswith("AssertionError: Failed to get checksums.txt")
    monkeypatch.setattr(probes, "open_context", fake_gpu((10, 0)))
    assert run_probes(["fp4"])[0].status == ProbeStatus.RUNTIME_ERROR  # on its own arch it is a plain failure


# ---------------------------------------------------------------- datasheet peaks


@pytest.mark.parametrize(
    ("name", "metric", "peak"),
    [
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H200", "memory", 4800.0),
        ("NVIDIA H200 NVL", "bf16", 835.0),
        ("NVIDIA H100 80GB HBM3", "fp8", 1979.0),
        ("NVIDIA H100 80GB HBM3", "memory", 3350.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA B200", "fp4", 9000.0),
        ("NVIDIA GB200", "bf16", 2500.0),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "fp4", 2000.0),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "memory", 1792.0),
        ("NVIDIA GeForce RTX 5090", "fp8", 838.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA A100-SXM4-80GB", "memory", 2039.0),
        ("NVIDIA A100-SXM4-40GB", "bf16", 312.0),
    ],
)
def test_peaks_are_found_by_the_names_nvml_reports(name, metric, peak):
    assert peak_for(name, metric) == peak


def test_unknown_gpus_and_missing_formats_have_no_peak():
    assert peak_for("NVIDIA GeForce GTX 1080", "bf16") is None
    assert peak_for("NVIDIA A100-SXM4-80GB", "fp8") is None  # Ampere has no FP8 tensor cores
    assert peak_for(None, "bf16") is None
    with pytest.raises(ValueError, match="unknown peak metric"):
        peak_for("NVIDIA H200", "int8")

"""FlashInfer's downloaded kernels: what the inventory finds on an offline host, within its time limit."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tests.worker.test_inventory_probes import (
    fake_gpu,
    raising,
    worker_cli,
)
from worker import probes
from worker.inventory import take_inventory
from worker.probes import Probe, ProbeResult, ProbeStatus, run_probes

# ---------------------------------------------------------------- FlashInfer's downloaded kernels, offline


@pytest.fixture
def loopback_only(monkeypatch):
    """Any socket connect in the test to an address outside 127.0.0.0/8 and ::1 fails the test."""
    import ipaddress
    import socket

    real = socket.socket.connect
    tried: list[Any] = []

    def guarded(sock: socket.socket, address: Any) -> Any:
        tried.append(address)
        host = address[0] if isinstance(address, tuple) else address
        assert ipaddress.ip_address(host).is_loopback, f"a test tried to reach {address}"
        return real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    for name in ("FLASHINFER_CUBIN_DIR", "FLASHINFER_CUBINS_REPOSITORY", "FLASHINFER_DISABLE_VERSION_CHECK"):
        monkeypatch.delenv(name, raising=False)
    return tried


def to_loopback(host: str, port: int) -> list[tuple[Any, ...]]:
    """A resolver that answers every name with 127.0.0.1."""
    import socket

    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]


FI = {"flashinfer": "0.6.1", "flashinfer-cubin": None, "flashinfer-jit-cache": None}


def test_an_offline_host_without_cubins_says_missing_artifacts_with_the_pip_fix_in_under_2_s(loopback_only):
    import socket

    from worker.inventory import ArtifactState, flashinfer_artifacts

    with socket.socket() as closed:  # a port nothing listens on: connection refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {"FLASHINFER_CUBINS_REPOSITORY": f"https://artifacts.example.invalid:{port}/cubins/"}
    started = time.monotonic()
    status = flashinfer_artifacts(environ=env, versions=FI, resolve=to_loopback)
    assert time.monotonic() - started < 2
    assert status.state == ArtifactState.MISSING and not status.available
    assert status.download_host == f"artifacts.example.invalid:{port}"
    assert status.download_url_from == "FLASHINFER_CUBINS_REPOSITORY" and status.reachable is False
    assert "no flashinfer-cubin package and FLASHINFER_CUBIN_DIR is not set" in (status.reason or "")
    assert "ConnectionRefusedError" in (status.reach_detail or "")
    assert (status.fix or "").startswith("pip install flashinfer-cubin==0.6.1")
    assert loopback_only == [("127.0.0.1", port)]
    line = status.summary()
    assert line.startswith("FlashInfer download-at-first-use kernels: missing_artifacts:")
    assert "fix: pip install flashinfer-cubin==0.6.1" in line


def test_a_resolver_that_hangs_is_given_up_on_at_the_time_limit(loopback_only):
    from worker.inventory import ArtifactState, flashinfer_artifacts

    def hangs(host: str, port: int) -> list[tuple[Any, ...]]:
        time.sleep(3)
        return to_loopback(host, port)

    started = time.monotonic()
    status = flashinfer_artifacts(environ={}, versions=FI, resolve=hangs, timeout_s=0.3)
    took = time.monotonic() - started
    assert status.state == ArtifactState.MISSING and 0.25 < took < 1.5
    assert status.reach_detail == "resolving edge.urm.nvidia.com took longer than 0.3 s"
    assert loopback_only == []  # nothing was connected to


def test_the_default_time_limit_is_two_seconds():
    import inspect

    from worker.inventory import ARTIFACT_CONNECT_TIMEOUT_S, flashinfer_artifacts, reach

    assert ARTIFACT_CONNECT_TIMEOUT_S == 2.0
    for fn in (flashinfer_artifacts, reach):
        assert inspect.signature(fn).parameters["timeout_s"].default == 2.0


def test_a_reachable_download_host_makes_the_kernels_available_without_downloading_anything(loopback_only):
    import socket

    from worker.inventory import flashinfer_artifacts

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        env = {"FLASHINFER_CUBINS_REPOSITORY": f"http://mirror.example.invalid:{port}/"}
        status = flashinfer_artifacts(environ=env, versions=FI, resolve=to_loopback)
    assert status.available and status.reachable is True and status.state == "available"
    assert f"mirror.example.invalid:{port} reachable" in (status.source or "")
    assert status.to_dict()["available"] is True


def test_the_download_url_is_read_from_flashinfers_own_source_when_not_overridden(tmp_path, monkeypatch):
    import importlib.util

    from worker.inventory import flashinfer_repository

    package = tmp_path / "flashinfer"
    (package / "jit").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "jit" / "cubin_loader.py").write_text(
        'FLASHINFER_CUBINS_REPOSITORY = os.environ.get(\n    "FLASHINFER_CUBINS_REPOSITORY",\n'
        '    "https://cubins.example.invalid/repo/",\n)\n'
    )
    spec = importlib.util.spec_from_file_location(
        "flashinfer", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: spec if name == "flashinfer" else real_find_spec(name, *a),
    )
    url, origin = flashinfer_repository({})
    assert url == "https://cubins.example.invalid/repo/" and origin.endswith("jit/cubin_loader.py")
    assert flashinfer_repository({"FLASHINFER_CUBINS_REPOSITORY": "http://m/"}) == (
        "http://m/",
        "FLASHINFER_CUBINS_REPOSITORY",
    )


def test_an_installed_matching_cubin_package_or_a_populated_cubin_dir_needs_no_network(
    loopback_only, tmp_path
):
    from worker.inventory import flashinfer_artifacts

    def never(host: str, port: int) -> list[tuple[Any, ...]]:
        raise AssertionError("no lookup was needed")

    packaged = flashinfer_artifacts(
        environ={},
        versions={**FI, "flashinfer-cubin": "0.6.1", "flashinfer-jit-cache": "0.6.1+cu129"},
        resolve=never,
    )
    assert packaged.available and packaged.source == "flashinfer-cubin 0.6.1 installed (flashinfer 0.6.1)"
    (tmp_path / "batched_gemm").mkdir()
    (tmp_path / "batched_gemm" / "a.cubin").write_bytes(b"\0")
    folder = flashinfer_artifacts(environ={"FLASHINFER_CUBIN_DIR": str(tmp_path)}, versions=FI, resolve=never)
    assert folder.available and folder.cubin_dir_files == 1
    assert folder.source == f"FLASHINFER_CUBIN_DIR={tmp_path} holds 1 files"
    assert loopback_only == []


def test_a_cubin_package_of_another_version_is_named_as_the_problem(loopback_only):
    from worker.inventory import ArtifactState, flashinfer_artifacts

    status = flashinfer_artifacts(environ={}, versions={**FI, "flashinfer-cubin": "0.5.3"})
    assert status.state == ArtifactState.VERSION_MISMATCH
    assert (
        status.reason
        == "flashinfer-cubin 0.5.3 installed beside flashinfer 0.6.1: FlashInfer refuses to load"
    )
    assert loopback_only == []


def test_without_flashinfer_nothing_is_checked_and_the_inventory_says_so(loopback_only, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    data = take_inventory().to_dict()
    if data["versions"]["flashinfer"] is None:  # this machine
        artifacts = data["flashinfer_artifacts"]
        assert artifacts["state"] == "not_installed" and artifacts["available"] is False
        assert artifacts["reach_detail"] == "not checked: no FlashInfer" and artifacts["reachable"] is None
    assert loopback_only == []


def test_a_probe_whose_kernels_are_downloaded_answers_missing_artifacts_at_once_without_running(monkeypatch):
    from worker.inventory import flashinfer_artifacts

    ran: list[str] = []

    def slow(ctx: Any, r: ProbeResult) -> None:
        ran.append(r.name)
        time.sleep(35)  # what FlashInfer's download retries cost

    missing = flashinfer_artifacts(environ={}, versions=FI, resolve=lambda h, p: [])
    fakes = [
        Probe(
            "trtllm", "flashinfer_trtllm", probes.Component.MOE, "", slow, needs="flashinfer", downloads=True
        ),
        Probe("cutlass", "flashinfer_cutlass", probes.Component.MOE, "", raising("boom"), needs="flashinfer"),
    ]
    monkeypatch.setattr(probes, "PROBES", {p.name: p for p in fakes})
    monkeypatch.setattr(probes, "open_context", fake_gpu((9, 0)))
    monkeypatch.setattr(probes.harness.importlib.util, "find_spec", lambda name: SimpleNamespace(name=name))
    started = time.monotonic()
    trtllm, cutlass = run_probes(artifacts=missing)
    assert time.monotonic() - started < 2 and ran == []
    assert trtllm.status == ProbeStatus.MISSING_ARTIFACTS and not trtllm.runs
    assert trtllm.error.startswith(
        "FlashInfer's downloaded kernels are not on this host: no flashinfer-cubin"
    )
    assert trtllm.error_detail.startswith("fix: pip install flashinfer-cubin==0.6.1")
    assert trtllm.to_dict()["status"] == "MISSING_ARTIFACTS"
    assert cutlass.status == ProbeStatus.RUNTIME_ERROR  # built from source: not held back


def test_only_the_trtllm_gen_probe_waits_on_downloaded_kernels():
    assert [name for name, p in probes.PROBES.items() if p.downloads] == ["flashinfer_trtllm_moe_fp4"]


def test_inventory_and_probe_write_their_json_to_out_as_well(tmp_path):
    done = worker_cli("inventory", "--out", str(tmp_path / "inventory.json"))
    assert done.returncode == 0, done.stderr
    assert "FlashInfer download-at-first-use kernels:" in done.stdout
    saved = json.loads((tmp_path / "inventory.json").read_text())
    assert saved["flashinfer_artifacts"]["state"] in {
        "not_installed",
        "available",
        "missing_artifacts",
        "version_mismatch",
    }
    probed = worker_cli("probe", "gemm_bf16", "--perturb", "--out", str(tmp_path / "probes.json"))
    assert probed.returncode == 0, probed.stderr
    assert "control run (--perturb)" in probed.stdout
    document = json.loads((tmp_path / "probes.json").read_text())
    assert document["perturbed"] is True and [p["name"] for p in document["probes"]] == ["gemm_bf16"]

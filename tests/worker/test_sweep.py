"""The backend sweep on CPU: shapes read from the log, torch candidates checked and ranked, the rest
recorded with their reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchlab.core.shapes import read_shapes, read_shapes_file

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "sweep"
torch = pytest.importorskip("torch")


def test_the_shapes_come_from_the_args_dump_and_config_and_say_where() -> None:
    read = read_shapes_file(FIXTURES / "dsv4_flash_moe_crash.log")
    values = read.values()
    assert (values["hidden_size"], values["num_experts"], values["top_k"]) == (4096, 256, 6)
    assert read.facts["tp_size"].source == "args" and read.facts["tp_size"].line == 2
    assert read.facts["num_experts"].source == "config"
    # dtype='auto' and quantization=None in the args: both come from the checkpoint, said as inferred
    assert read.facts["dtype"].source == "inferred" and values["dtype"] == "bfloat16"
    assert (
        read.facts["quantization"].value == "modelopt_fp4" and read.facts["quantization"].source == "inferred"
    )
    assert read.per_rank()["moe_intermediate_size"] == 2048 // 4
    assert read.args["moe_runner_backend"] == "flashinfer_trtllm"


def test_missing_values_are_inferred_or_defaulted_never_passed_off_as_read() -> None:
    read = read_shapes(['config: {"hidden_size": 1024, "num_attention_heads": 16}'])
    assert read.facts["head_dim"].value == 64 and read.facts["head_dim"].source == "inferred"
    assert read.facts["num_key_value_heads"].source == "inferred"
    assert read.facts["num_experts"].source == "default"
    assert "num_experts" in read.to_dict()["defaulted"]


def _sweep(component: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / f"{component}.json"
    done = subprocess.run(
        [sys.executable, "-m", "worker", "sweep", str(FIXTURES / "tiny_moe.log"), "--component", component,
         "--json", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    assert json.loads(out.read_text(encoding="utf-8")) == data
    return data


def test_the_moe_sweep_runs_its_torch_candidates_on_cpu_checks_and_ranks_them(tmp_path: Path) -> None:
    data = _sweep("moe", tmp_path)
    by_name = {c["name"]: c for c in data["candidates"]}  # type: ignore[union-attr,index]
    assert data["shapes"]["hidden_size"] == 64 and data["shapes"]["moe_intermediate_size"] == 32  # type: ignore[index]
    for name in ("torch_loop", "torch_grouped_mm"):
        assert by_name[name]["status"] == "PASSED" and by_name[name]["correct"]
        assert by_name[name]["extra"]["checked_elements"] == 64 * 64
        assert by_name[name]["tolerance"] == {"atol": 0.01, "rtol": 0.01, "required_match": 0.95}
    ranks = sorted(c["rank"] for c in by_name.values() if c["rank"] is not None)
    assert ranks == [1, 2]
    # Triton cannot run here: recorded as unavailable with its reason, never ranked
    assert by_name["triton"]["rank"] is None and by_name["triton"]["available"] is False
    assert by_name["triton"]["error"]
    assert by_name["flashinfer_cutlass"]["error"]
    # baselines are no server flag: nothing to propose on a CPU host
    assert data["proposed_fix"] is None


def test_the_attention_sweep_proposes_the_servers_flag_value_of_the_fastest_correct_backend(
    tmp_path: Path,
) -> None:
    data = _sweep("attention", tmp_path)
    fix = data["proposed_fix"]
    assert fix is not None and fix["flag"] == "--attention-backend"  # type: ignore[index]
    assert fix["value"] == "torch_native"  # type: ignore[index]
    first = data["candidates"][0]  # type: ignore[index]
    assert first["rank"] == 1 and first["correct"]


def test_a_wrong_backend_fails_the_whole_output_check() -> None:
    from worker.probes import ProbeResult
    from worker.sweep import SweepEntry, check, rank

    ref = torch.randn(64, 64)
    good = SweepEntry(ProbeResult("good", "x", "moe"), required=0.95)
    bad = SweepEntry(ProbeResult("bad", "x", "moe"), required=0.95)
    check(good, ref.to(torch.bfloat16), ref)
    wrong = ref.clone()
    wrong[:8] = 0.5  # 1/8 of the output wrong: past the 5% MoE allowance
    check(bad, wrong, ref)
    good.result.ms, bad.result.ms = 2.0, 1.0
    ranked = rank([bad, good])
    assert bad.result.status == "INCORRECT_NUMERICAL" and not bad.correct
    assert ranked[0] is good and good.rank == 1 and bad.rank is None


def test_a_proposal_resting_on_our_own_stand_in_kernel_says_it_is_one() -> None:
    from worker.probes import ProbeResult
    from worker.sweep import SweepEntry, check, propose, rank

    ref = torch.randn(32, 32)
    triton = SweepEntry(ProbeResult("triton", "triton (worker.repro.triton_moe)", "moe"), flag_value="triton")
    check(triton, ref.clone(), ref)
    triton.result.ms = 1.0
    fix = propose("moe", rank([triton]))
    assert fix is not None and fix["value"] == "triton"
    assert fix["stand_in"] is True and "not how fast the server's kernel is" in fix["why"]

"""What a GPU host agrees to run: every refusal names the rule, and nothing starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from worker.config import FORCED_ENV, WorkerConfig
from worker.policy import Refused, approve
from worker.repro import REPRO_MODELS_DIR

TOY = str(REPRO_MODELS_DIR / "toy-moe")


@pytest.fixture
def config(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig(
        host="h200-test",
        launchers={
            "repro:moe-serve": [sys.executable, "-m", "worker.repro", "moe-serve"],
            "sglang": [sys.executable, "-m", "sglang.launch_server"],
        },
        model_roots=(REPRO_MODELS_DIR.resolve(), tmp_path.resolve()),
    )


def spec(launcher: str, *args: str, **env: str) -> dict:
    return {"launcher": launcher, "args": list(args), "env": env}


def test_a_repro_launch_inside_the_rules_is_approved_with_the_forced_multicast_switches(config):
    approved = approve(
        spec("repro:moe-serve", "--model-path", TOY, "--moe-runner-backend", "torch", NCCL_DEBUG="INFO"),
        config,
    )
    assert approved.argv()[:4] == [sys.executable, "-m", "worker.repro", "moe-serve"]
    env = approved.env({"PATH": "/usr/bin"})
    assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/usr/bin"
    assert all(env[name] == value for name, value in FORCED_ENV.items())


def test_a_launcher_this_host_does_not_allow_is_refused(config):
    with pytest.raises(
        Refused, match=r"launcher 'vllm' is not allowed on h200-test \(allowed: repro:moe-serve, sglang\)"
    ):
        approve(spec("vllm", "/models/x"), config)


def test_a_shell_metacharacter_is_refused(config):
    with pytest.raises(Refused, match="shell metacharacter"):
        approve(spec("repro:moe-serve", "--model-path", TOY + ";reboot"), config)


def test_an_unknown_flag_is_refused(config):
    with pytest.raises(Refused, match="unknown flag --turbo for repro:moe-serve"):
        approve(spec("repro:moe-serve", "--model-path", TOY, "--turbo", "1"), config)


def test_a_value_outside_a_flags_choices_is_refused(config):
    with pytest.raises(Refused, match="--moe-runner-backend cutedsl is not one of"):
        approve(spec("repro:moe-serve", "--model-path", TOY, "--moe-runner-backend", "cutedsl"), config)


def test_a_model_outside_the_roots_is_refused_also_through_dot_dot(config):
    with pytest.raises(Refused, match="model '/etc' is not under this host's model roots"):
        approve(spec("repro:moe-serve", "--model-path", "/etc"), config)
    sneaky = str(REPRO_MODELS_DIR / ".." / ".." / "..")
    with pytest.raises(Refused, match="is not under this host's model roots"):
        approve(spec("repro:moe-serve", "--model-path", sneaky), config)


def test_an_environment_variable_outside_the_allowlist_is_refused(config):
    with pytest.raises(Refused, match="environment variable LD_PRELOAD is not in this host's allowlist"):
        approve(spec("repro:moe-serve", "--model-path", TOY, LD_PRELOAD="/tmp/x.so"), config)
    with pytest.raises(Refused, match="NCCL_NVLS_ENABLE is set by the worker itself"):
        approve(spec("repro:moe-serve", "--model-path", TOY, NCCL_NVLS_ENABLE="1"), config)


def test_every_broken_rule_is_named_at_once(config):
    with pytest.raises(Refused) as refused:
        approve(spec("repro:moe-serve", "--model-path", "/root", "--turbo", LD_PRELOAD="x"), config)
    message = str(refused.value)
    assert "unknown flag --turbo" in message and "model '/root'" in message and "LD_PRELOAD" in message


def test_sglang_flags_are_checked_against_the_installed_release_catalog(config, tmp_path):
    # No SGLang here: the newest release in the catalog is the reference.
    with pytest.raises(Refused, match="unknown flag --speculative-moe-runnr for sglang"):
        approve(spec("sglang", "--model-path", str(tmp_path), "--speculative-moe-runnr", "triton"), config)
    approved = approve(
        spec("sglang", "--model-path", str(tmp_path), "--moe-runner-backend", "triton", "--port", "1234"),
        config,
    )
    assert approved.argv()[3:] == [
        "--model-path",
        str(tmp_path),
        "--moe-runner-backend",
        "triton",
        "--port",
        "1234",
    ]


def test_a_tensor_parallel_launch_is_refused_on_a_host_with_fewer_gpus(config, tmp_path):
    launch = spec("sglang", "--model-path", str(tmp_path), "--tp", "4")
    with pytest.raises(
        Refused, match=r"needs 4 GPUs \(TP 4\) and h200-test has 1: it must run on a host with at least 4"
    ):
        approve(launch, config, gpu_count=1)
    assert approve(launch, config, gpu_count=8).argv()[-2:] == ["--tp", "4"]


def test_dp_attention_shares_the_tp_groups_gpus_but_plain_dp_replicates_them(config, tmp_path):
    base = ["--model-path", str(tmp_path), "--tp-size", "2", "--dp-size", "2"]
    with pytest.raises(Refused, match=r"needs 4 GPUs \(TP 2 x DP 2\)"):
        approve(spec("sglang", *base), config, gpu_count=2)
    approve(spec("sglang", *base, "--enable-dp-attention"), config, gpu_count=2)


def test_nccl_reports_its_transports_unless_the_launch_says_otherwise(config):
    approved = approve(spec("repro:moe-serve", "--model-path", TOY), config)
    assert approved.env({})["NCCL_DEBUG"] == "INFO"
    quiet = approve(spec("repro:moe-serve", "--model-path", TOY, NCCL_DEBUG="WARN"), config)
    assert quiet.env({})["NCCL_DEBUG"] == "WARN"

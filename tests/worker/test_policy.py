"""What a GPU host agrees to run: every refusal names the rule, and nothing starts."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from worker.config import FORCED_ENV, ConfigError, WorkerConfig, load_config
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


@pytest.fixture
def servers(tmp_path: Path) -> tuple[WorkerConfig, str]:
    model = tmp_path / "models" / "qwen"
    model.mkdir(parents=True)
    launchers = {
        "sglang": [sys.executable, "-m", "sglang.launch_server"],
        "vllm": ["/usr/bin/vllm", "serve"],
        "vllm-api-server": [sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
    }
    config = WorkerConfig(
        host="h200-test", launchers=launchers, model_roots=((tmp_path / "models").resolve(),)
    )
    return config, str(model)


HOSTILE = [
    # Spellings the old check missed: an alias, an abbreviation, the `=` form.
    (
        "sglang",
        ["--model-path", "{M}", "--speculative-draft-model", "/outside"],
        "model '/outside' is not under",
    ),
    (
        "sglang",
        ["--model-path", "{M}", "--speculative-draft-model-p", "/outside"],
        "model '/outside' is not under",
    ),
    ("sglang", ["--model-path={M}", "--model=/outside"], "model '/outside' is not under"),
    (
        "sglang",
        ["--model-path", "{M}", "--speculative-draft-model", "org/draft"],
        "model 'org/draft' is not under",
    ),
    ("sglang", ["--model-path", "{M}", "--trust-remote-code"], "--trust-remote-code loads code"),
    (
        "sglang",
        ["--model-path", "{M}", "--custom-weight-loader", "evil.load"],
        "--custom-weight-loader loads code",
    ),
    ("sglang", ["--model-path", "{M}", "--lora-paths", "x=/outside"], "model '/outside' is not under"),
    ("sglang", ["--model-path", "{M}", "--config", "/etc/passwd"], "--config loads code"),
    ("sglang", ["--model-path", "{M}", "--chat-template", "/etc/shadow"], "--chat-template loads code"),
    (
        "sglang",
        ["--model-path", "{M}", "--dist-init-addr", "10.0.0.1:5000"],
        "--dist-init-addr belongs to the host",
    ),
    ("sglang", ["--model-path", "{M}", "--base-gpu-id", "3"], "--base-gpu-id belongs to the host"),
    # vLLM reads a bare word as the model, wherever it stands.
    ("vllm", ["--trust-remote-code", "attacker/evil-model"], "model 'attacker/evil-model' is not under"),
    ("vllm", ["--trust-remote-code", "attacker/evil-model"], "--trust-remote-code loads code"),
    ("vllm", ["--max-model-len", "4096", "/outside"], "model '/outside' is not under"),
    ("vllm", ["{M}", "--max-model-len", "4096", "/outside"], "'/outside' is not the value of any flag"),
    ("vllm", ["{M}", "--spec-model", "/outside"], "model '/outside' is not under"),
    ("vllm", ["{M}", "--speculative-config", '{"model": "/outside"}'], "--speculative-config loads code"),
    ("vllm", ["{M}", "--speculative-config.model", "/outside"], "--speculative-config loads code"),
    ("vllm", ["{M}", "--hf-config-path", "/outside"], "--hf-config-path loads code"),
    ("vllm", ["{M}", "--tool-parser-plugin", "/tmp/evil.py"], "--tool-parser-plugin loads code"),
    ("vllm", ["{M}", "--worker-extension-cls", "evil.Ext"], "--worker-extension-cls loads code"),
    ("vllm", ["{M}", "--config", "/tmp/args.yaml"], "--config loads code"),
    ("vllm", ["{M}", "--worker_cls", "evil.Worker"], "--worker-cls loads code"),
    ("vllm", ["--max-model-len", "4096"], "the launch names no model"),
    ("vllm-api-server", ["--model", "{M}", "/outside"], "'/outside' is not the value of any flag"),
]


@pytest.mark.parametrize(("launcher", "args", "message"), HOSTILE)
def test_a_hostile_launch_is_refused_however_the_server_would_spell_it(servers, launcher, args, message):
    config, model = servers
    with pytest.raises(Refused, match=re.escape(message)):
        approve(spec(launcher, *(a.replace("{M}", model) for a in args)), config)


@pytest.mark.parametrize(
    ("launcher", "args"),
    [
        ("sglang", ["--model-path", "{M}", "--tp", "2", "--mem-fraction-static", "0.8", "--port=3"]),
        ("sglang", ["--model", "{M}", "--lora-paths", "a={M}", "--attention-backend", "flashinfer"]),
        ("vllm", ["{M}", "-tp", "2", "--max_model_len", "4096", "--enforce-eager"]),
        ("vllm", ["{M}", "--gpu-memory-utilization=0.8", "--disable-prefix-caching"]),
        ("vllm-api-server", ["--model", "{M}", "--dtype", "bfloat16"]),
    ],
)
def test_an_ordinary_launch_with_a_model_under_the_roots_is_approved(servers, launcher, args):
    config, model = servers
    approved = approve(spec(launcher, *(a.replace("{M}", model) for a in args)), config, gpu_count=8)
    assert approved.argv()[: len(config.launchers[launcher])] == config.launchers[launcher]
    assert model in approved.argv()


def test_a_code_loading_flag_passes_only_when_the_host_allows_it_by_name_and_its_file_is_the_hosts(servers):
    config, model = servers
    allowing = WorkerConfig(
        host=config.host,
        launchers=config.launchers,
        model_roots=config.model_roots,
        allowed_flags=frozenset({"--trust-remote-code", "--chat-template"}),
    )
    approve(spec("sglang", "--model-path", model, "--trust-remote-code"), allowing)
    approve(spec("sglang", "--model-path", model, "--chat-template", "chatml"), allowing)
    with pytest.raises(Refused, match="--chat-template file '/etc/shadow' is not under"):
        approve(spec("sglang", "--model-path", model, "--chat-template", "/etc/shadow"), allowing)
    with pytest.raises(Refused, match="--custom-weight-loader loads code"):
        approve(spec("sglang", "--model-path", model, "--custom-weight-loader", "x.y"), allowing)


@pytest.mark.parametrize(
    "name",
    ["NCCL_DEBUG_FILE", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "TRITON_PTXAS_PATH", "TORCH_EXTENSIONS_DIR",
     "LD_PRELOAD", "PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "SGLANG_ANYTHING", "VLLM_PLUGINS"],
)  # fmt: skip
def test_environment_variables_that_load_code_files_or_libraries_are_refused(config, name):
    with pytest.raises(Refused, match=f"environment variable {name} is not in this host's allowlist"):
        approve(spec("repro:moe-serve", "--model-path", TOY, **{name: "/tmp/x"}), config)


def test_a_launch_cannot_choose_the_gpus_the_worker_passes_on_its_own(config):
    with pytest.raises(Refused, match="CUDA_VISIBLE_DEVICES is set by the worker from its own GPU selection"):
        approve(spec("repro:moe-serve", "--model-path", TOY, CUDA_VISIBLE_DEVICES="0,1,2,3"), config)
    approved = approve(spec("repro:moe-serve", "--model-path", TOY), config)
    assert approved.env({"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "5"})["CUDA_VISIBLE_DEVICES"] == "5"


def test_the_allowlist_is_widened_by_exact_names_only(monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_WORKER_ENV_ALLOW", "MY_SWITCH")
    config = load_config()
    assert config.env_allowed("MY_SWITCH") and not config.env_allowed("MY_SWITCH_2")
    monkeypatch.setenv("DISPATCHLAB_WORKER_ENV_ALLOW", "NCCL_*")
    with pytest.raises(ConfigError, match="name each variable in full"):
        load_config()
    monkeypatch.setenv("DISPATCHLAB_WORKER_ENV_ALLOW", "NCCL_NET_PLUGIN")
    with pytest.raises(ConfigError, match="NCCL_NET_PLUGIN loads code, files or the network"):
        load_config()
    monkeypatch.setenv("DISPATCHLAB_WORKER_ENV_ALLOW", "")
    monkeypatch.setenv("DISPATCHLAB_WORKER_ALLOW_FLAGS", "--trust-remote-code, --chat-template")
    assert load_config().allowed_flags == {"--trust-remote-code", "--chat-template"}

"""A launch read from a log, with a diagnosis's fix applied: what "Confirm on GPU" starts from."""

from __future__ import annotations

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.launch import (
    LaunchError,
    apply_patch,
    flag_problems,
    launch_diff,
    launch_from_args_dump,
    launch_from_command,
    launch_from_document,
    launch_from_spec,
)
from tests.core.helpers import LOGS


@pytest.fixture(scope="module")
def seed_document() -> dict:
    return analyze_paths([LOGS / "sglang_dsv4_eagle_sm120.log"])


def test_the_seed_crash_launch_with_its_fix_swaps_the_moe_runner_and_drops_speculative_decoding(
    seed_document,
):
    launch = launch_from_document(seed_document)
    assert launch is not None and launch.launcher == "sglang"
    fix = seed_document["matches"][0]["fix"]
    fixed = apply_patch(launch, args=fix["args"], env=fix["env"])
    args = fixed.args()
    assert args[args.index("--moe-runner-backend") + 1] == "flashinfer_cutlass"
    assert "--speculative-algorithm" not in args
    assert args[args.index("--model-path") + 1] == "/models/DeepSeek-V4-Flash-NVFP4"
    kinds = {(line.kind, line.text) for line in launch_diff(launch, fixed)}
    assert ("removed", "--speculative-algorithm EAGLE") in kinds
    assert ("changed", "--moe-runner-backend flashinfer_cutlass") in kinds
    assert flag_problems(fixed, version=seed_document["server_version"]) == []


def test_a_log_without_a_command_line_is_rebuilt_from_its_args_dump(seed_document):
    document = dict(seed_document, launch_command=None)
    launch = launch_from_args_dump(document)
    assert launch is not None and launch.source == "args dump"
    args = launch.args()
    assert args[args.index("--model-path") + 1] == "/models/DeepSeek-V4-Flash-NVFP4"
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--cuda-graph-bs") + 1 : args.index("--cuda-graph-bs") + 3] == ["1", "2"]
    # The resolved backends become explicit, so the re-run resolves the same way.
    assert args[args.index("--attention-backend") + 1] == "flashinfer"
    assert "--port" not in args and "--host" not in args


def test_the_edited_command_line_round_trips_through_its_readable_form():
    launch = launch_from_command(
        "CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server --model-path /m/x --tp 2 "
        "--enable-torch-compile --cuda-graph-bs 1 2 4"
    )
    again = launch_from_command(launch.command())
    assert again == launch
    assert launch.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert launch.option("--tp-size") is not None  # SGLang's alias of --tp


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("bash -c 'python -m sglang.launch_server'", "is not a launcher dispatchlab runs"),
        ("python -m sglang.launch_server --model-path /m; rm -rf /", "shell metacharacter ';'"),
        ("python -m sglang.launch_server --model-path $(whoami)", "shell metacharacter '$'"),
        ("vllm serve /m > out.log", "shell metacharacter '>'"),
        ("", "empty"),
        ("python -m sglang.launch_server --model-path '/m", "cannot be read"),
    ],
)
def test_commands_that_are_not_plain_launches_are_refused_with_the_reason(command, message):
    with pytest.raises(LaunchError, match=message.replace("$", r"\$").replace("(", r"\(")):
        launch_from_command(command)


def test_vllm_serve_keeps_its_positional_model_and_checks_vllm_flags():
    launch = launch_from_command("vllm serve /models/qwen --tensor-parallel-size 2 --no-such-flag 3")
    assert launch.server == "vllm" and launch.positional == ("/models/qwen",)
    problems = flag_problems(launch, version=None)
    assert problems == ["unknown flag --no-such-flag for vllm (newest known)"]


def test_a_choice_outside_the_catalog_is_named():
    launch = launch_from_command("python -m sglang.launch_server --model-path /m --moe-runner-backend warp9")
    (problem,) = flag_problems(launch, version="0.5.23")
    assert problem.startswith("--moe-runner-backend warp9 is not one of")


def test_a_spec_from_the_broker_is_checked_like_a_command_line():
    with pytest.raises(LaunchError, match="must be a list of strings"):
        launch_from_spec({"launcher": "sglang", "args": "--tp 2", "env": {}})
    with pytest.raises(LaunchError, match="shell metacharacter"):
        launch_from_spec({"launcher": "sglang", "args": ["--model-path", "/m|x"], "env": {}})
    with pytest.raises(LaunchError, match="not an environment variable name"):
        launch_from_spec({"launcher": "sglang", "args": [], "env": {"A B": "1"}})

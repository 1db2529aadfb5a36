"""What this host agrees to run. Every check names what it refused and why; nothing runs unless all
pass. The dashboard builds launches, but only this module decides, from the worker's own config."""

from __future__ import annotations

import argparse
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatchlab.core.launch import (
    REPRO_PREFIX,
    WORKER_OWNED_FLAGS,
    Launch,
    LaunchError,
    flag_key,
    flag_problems,
    launch_from_spec,
)
from worker.config import FORCED_ENV, WorkerConfig
from worker.repro import repro_parser

MODEL_FLAGS = (
    "--model-path",
    "--model",
    "--tokenizer-path",
    "--tokenizer",
    "--speculative-draft-model-path",
    "--speculative-draft",
)
PACKAGE_OF_SERVER = {"sglang": "sglang", "vllm": "vllm"}


class Refused(ValueError):
    """The launch breaks this host's policy. The message says which rule and what to change."""


@dataclass(frozen=True)
class ApprovedLaunch:
    launch: Launch
    program: list[str]
    server_version: str | None

    def argv(self) -> list[str]:
        return [*self.program, *self.launch.args()]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        # NCCL's own INFO lines name the transport chosen per GPU pair; the report shows them.
        return {**base, "NCCL_DEBUG": "INFO", **self.launch.env, **FORCED_ENV}


@functools.lru_cache(maxsize=16)
def installed_version(program: tuple[str, ...], package: str) -> str | None:
    """The version of `package` that the launcher's own Python sees (it may be another venv)."""
    python = program[0]
    if len(program) < 2 or program[1] != "-m":
        # A console script (`sglang serve`): its first line names its interpreter.
        try:
            first = Path(python).read_text(errors="replace").splitlines()[0]
        except (OSError, IndexError):
            return None
        if not first.startswith("#!"):
            return None
        python = first[2:].strip().split()[0]
    try:
        done = subprocess.run(
            [python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _repro_problems(parser: argparse.ArgumentParser, launch: Launch) -> list[str]:
    known = {flag_key(option, "repro") for action in parser._actions for option in action.option_strings}
    problems = []
    for option in launch.options:
        if flag_key(option.flag, "repro") not in known:
            problems.append(f"unknown flag {option.flag} for {launch.launcher}")
            continue
        action = next(
            a
            for a in parser._actions
            if flag_key(option.flag, "repro") in {flag_key(o, "repro") for o in a.option_strings}
        )
        if action.choices and option.values and option.values[0] not in action.choices:
            problems.append(
                f"{option.flag} {option.values[0]} is not one of {', '.join(map(str, action.choices))}"
            )
    return problems


def _model_paths(launch: Launch) -> list[str]:
    paths = [value for option in launch.options if option.flag in MODEL_FLAGS for value in option.values[:1]]
    if launch.server == "vllm" and launch.positional:
        paths.append(launch.positional[0])
    return paths


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _int_option(launch: Launch, *flags: str) -> int:
    for flag in flags:
        option = launch.option(flag)
        if option is not None and option.values and option.values[0].isdigit():
            return int(option.values[0])
    return 1


def gpus_needed(launch: Launch) -> tuple[int, str]:
    """How many GPUs the launch's parallelism asks for, and the flags that say so."""
    tp = _int_option(launch, "--tp-size", "--tensor-parallel-size", "--tp")
    pp = _int_option(launch, "--pp-size", "--pipeline-parallel-size", "--pp")
    dp = _int_option(launch, "--dp-size", "--data-parallel-size", "--dp")
    # SGLang's DP attention splits the TP group's GPUs; plain DP replicates the group.
    if launch.option("--enable-dp-attention") is not None:
        dp = 1
    parts = [f"{name} {value}" for name, value in (("TP", tp), ("PP", pp), ("DP", dp)) if value > 1]
    return tp * pp * dp, " x ".join(parts)


def approve(spec: dict[str, Any], config: WorkerConfig, *, gpu_count: int | None = None) -> ApprovedLaunch:
    """The launch as this host will run it, or Refused naming every rule it breaks. `gpu_count` is
    how many GPUs this host has (None: not checked)."""
    try:
        launch = launch_from_spec(spec)
    except LaunchError as error:
        raise Refused(str(error)) from None
    program = config.launchers.get(launch.launcher)
    if program is None:
        allowed = ", ".join(sorted(config.launchers)) or "none"
        raise Refused(f"launcher {launch.launcher!r} is not allowed on {config.host} (allowed: {allowed})")
    problems: list[str] = []
    version: str | None = None
    owned = {flag_key(f, launch.server) for f in WORKER_OWNED_FLAGS}
    checked = Launch(
        launcher=launch.launcher,
        positional=launch.positional,
        options=tuple(o for o in launch.options if flag_key(o.flag, launch.server) not in owned),
        env=launch.env,
    )
    if launch.launcher.startswith(REPRO_PREFIX):
        parser = repro_parser(launch.launcher[len(REPRO_PREFIX) :])
        if parser is None:
            problems.append(f"{launch.launcher} is not a repro program this worker has")
        else:
            problems += _repro_problems(parser, checked)
    elif launch.server in PACKAGE_OF_SERVER:
        version = installed_version(tuple(program), PACKAGE_OF_SERVER[launch.server])
        problems += flag_problems(checked, version=version)
    for value in _model_paths(launch):
        path = Path(value).expanduser()
        if not path.is_absolute() or not any(_under(path.resolve(), root) for root in config.model_roots):
            roots = ", ".join(str(r) for r in config.model_roots) or "none configured"
            problems.append(f"model {value!r} is not under this host's model roots ({roots})")
    for name in launch.env:
        if name in FORCED_ENV:
            problems.append(f"{name} is set by the worker itself and cannot be changed")
        elif not config.env_allowed(name):
            problems.append(f"environment variable {name} is not in this host's allowlist")
    needed, why = gpus_needed(launch)
    if gpu_count is not None and needed > 1 and needed > gpu_count:
        problems.append(
            f"the launch needs {needed} GPUs ({why}) and {config.host} has {gpu_count}: "
            f"it must run on a host with at least {needed}"
        )
    if problems:
        raise Refused("; ".join(problems))
    return ApprovedLaunch(launch=launch, program=list(program), server_version=version)

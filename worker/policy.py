"""What this host agrees to run. Every check names what it refused and why; nothing runs unless all
pass. The dashboard builds launches, but only this module decides, from the worker's own config.

Deny by default: the argument list that will run is read the way the server's own argparse reads it
(aliases, `=` forms, nargs, positionals; vLLM's underscores, `--flag.key value` and `-O` forms), every
flag it uses is classified by what it takes (worker/flag_kinds.py), and only switches, plain values,
model paths under the model roots and flags the host allows by name pass. Abbreviations are expanded
as argparse does only for a release the catalog holds exactly (or no installed release at all): for
another release a flag the catalog lacks could be what the server expands them to."""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatchlab.core.flags import catalog, release_for
from dispatchlab.core.launch import (
    REPRO_PREFIX,
    WORKER_OWNED_FLAGS,
    Launch,
    LaunchError,
    apply_patch,
    flag_key,
    launch_from_spec,
)
from worker.config import FORCED_ENV, WORKER_SELECTED_ENV, WorkerConfig
from worker.flag_kinds import REFUSED_BECAUSE, FlagKind, classify, closed_choices, number_type, takes_no_value
from worker.repro import repro_parser

PACKAGE_OF_SERVER = {"sglang": "sglang", "vllm": "vllm"}
# Launchers whose program takes the model as a positional argument (`vllm serve MODEL`).
MODEL_POSITIONAL_LAUNCHERS = {"vllm"}
ALLOW_FLAGS_SETTING = "DISPATCHLAB_WORKER_ALLOW_FLAGS"


class Refused(ValueError):
    """The launch breaks this host's policy. The message says which rule and what to change."""


@dataclass(frozen=True)
class FlagSpec:
    flag: str  # the canonical spelling
    names: tuple[str, ...]  # every spelling the server accepts as it is
    kind: FlagKind | None  # None: free text nobody reviewed
    nargs: int | str | None  # argparse's: None one value, 0 none, "?", "*", "+"
    choices: tuple[str, ...] | None = None
    number: type | None = None


@dataclass(frozen=True)
class UsedFlag:
    spec: FlagSpec
    spelling: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class ApprovedLaunch:
    launch: Launch
    program: list[str]
    server_version: str | None

    def argv(self) -> list[str]:
        return [*self.program, *self.launch.args()]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The child's environment. `base` is what the worker passes on from its own (its GPU
        selection included); a launch can set neither the forced switches nor the GPU selection."""
        # NCCL's own INFO lines name the transport chosen per GPU pair; the report shows them.
        selected = {name: base[name] for name in WORKER_SELECTED_ENV if name in base}
        return {**base, "NCCL_DEBUG": "INFO", **self.launch.env, **FORCED_ENV, **selected}


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


# ---------------------------------------------------------------- what each flag takes


@functools.lru_cache(maxsize=32)
def catalog_specs(server: str, version: str | None) -> tuple[FlagSpec, ...]:
    """The flags of the server's release (the newest catalogued one not newer than `version`)."""
    specs = []
    for flag, entry in release_for(server, version).items():
        specs.append(
            FlagSpec(
                flag=flag,
                names=(flag, *entry.get("aliases", [])),
                kind=classify(server, flag, entry),
                nargs=0 if takes_no_value(entry) else entry.get("nargs"),
                choices=closed_choices(entry),
                number=number_type(entry),
            )
        )
    return tuple(specs)


def repro_specs(parser: argparse.ArgumentParser) -> tuple[FlagSpec, ...]:
    """The flags of a repro program, from its own parser."""
    specs = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = max(action.option_strings, key=len)
        entry = {
            "nargs": action.nargs,
            "type": getattr(action.type, "__name__", None),
            "choices": list(action.choices) if action.choices else None,
            "action": "store_true" if action.nargs == 0 else None,
        }
        specs.append(
            FlagSpec(
                flag=flag,
                names=tuple(action.option_strings),
                kind=classify("repro", flag, entry),
                nargs=0 if takes_no_value(entry) else action.nargs,
                choices=closed_choices(entry),
                number=number_type(entry),
            )
        )
    return tuple(specs)


# ---------------------------------------------------------------- reading a launch as the server does


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and exit
        raise _ParseError(message)


class _Record(argparse.Action):
    def __init__(self, *args: Any, spec: FlagSpec, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = spec

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if values is None:
            found: tuple[str, ...] = ()
        elif isinstance(values, str):
            found = (values,)
        else:
            found = tuple(str(v) for v in values)
        namespace.used.append(UsedFlag(self.spec, option_string or "(positional)", found))


POSITIONAL_MODEL = FlagSpec(flag="MODEL (positional)", names=(), kind=FlagKind.MODEL, nargs="?")


@functools.lru_cache(maxsize=32)
def _parser(specs: tuple[FlagSpec, ...], positional_model: bool, abbreviations: bool) -> _Parser:
    parser = _Parser(add_help=False, allow_abbrev=abbreviations, exit_on_error=False)
    taken: set[str] = set()
    for spec in specs:
        names = [n for n in spec.names if n not in taken]
        if not names:
            continue
        taken.update(names)
        kwargs: dict[str, Any] = {"nargs": spec.nargs} if spec.nargs is not None else {}
        parser.add_argument(*names, action=_Record, spec=spec, default=argparse.SUPPRESS, **kwargs)
    if positional_model:
        parser.add_argument(
            "model", nargs="?", action=_Record, spec=POSITIONAL_MODEL, default=argparse.SUPPRESS
        )
    return parser


def _flexible(tokens: Sequence[str], names: set[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser rewrites before argparse: `--max_model_len` is `--max-model-len`,
    `--speculative-config.model X` sets a key of `--speculative-config`'s JSON, `-O3` is an
    optimization level and `-O.key` a key of the compilation config."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            out += tokens[i:]
            break
        if token.startswith("-O") and "-O" not in names and not token.startswith("--"):
            rest = token[2:].lstrip("=")
            if rest.startswith("."):
                token = "--compilation-config" + rest
            else:
                level = rest or (tokens[i + 1] if i + 1 < len(tokens) else "")
                i += 0 if rest else 1
                out += ["--optimization-level", level]
                i += 1
                continue
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            name = name.replace("_", "-")
            if "." in name:
                base, _, keys = name.partition(".")
                if not eq:
                    value = tokens[i + 1] if i + 1 < len(tokens) else ""
                    i += 1
                nested: Any = value
                for key in reversed(keys.split(".")):
                    nested = {key: nested}
                out += [base, json.dumps(nested)]
                i += 1
                continue
            token = name + eq + value
        out.append(token)
        i += 1
    return out


def _abbreviation_of(flag: str, names: set[str]) -> str | None:
    longer = sorted(n for n in names if n.startswith(flag) and n != flag)
    return longer[0] if len(longer) == 1 else None


def read_flags(
    tokens: Sequence[str],
    specs: tuple[FlagSpec, ...],
    *,
    server: str,
    positional_model: bool,
    who: str,
    abbreviations: bool = True,
) -> tuple[list[UsedFlag], list[str]]:
    """The flags the server would see in `tokens`, and the problems that stop it from reading them."""
    names = {n for spec in specs for n in spec.names}
    if "--" in tokens:
        return [], ["a bare `--` is not accepted: every argument must be a flag or the model"]
    if server == "vllm":
        tokens = _flexible(tokens, names)
    namespace = argparse.Namespace(used=[])
    try:
        _, extras = _parser(specs, positional_model, abbreviations).parse_known_args(list(tokens), namespace)
    except _ParseError as error:
        return namespace.used, [f"the arguments cannot be read as {who} reads them: {error}"]
    problems = []
    for extra in extras:
        flag = extra.split("=", 1)[0]
        if extra.startswith("-"):
            full = _abbreviation_of(flag, names)
            hint = f" (an abbreviation of {full}: write flags in full)" if full else ""
            problems.append(f"unknown flag {flag} for {who}{hint}")
        else:
            problems.append(f"{extra!r} is not the value of any flag {who} knows")
    return namespace.used, problems


# ---------------------------------------------------------------- the checks


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _path_problem(value: str, what: str, config: WorkerConfig) -> str | None:
    path = Path(value).expanduser()
    if path.is_absolute() and any(_under(path.resolve(), root) for root in config.model_roots):
        return None
    roots = ", ".join(str(r) for r in config.model_roots) or "none configured"
    return f"{what} {value!r} is not under this host's model roots ({roots})"


def _value_problems(used: UsedFlag, config: WorkerConfig) -> list[str]:
    spec, flag = used.spec, used.spelling
    kind = spec.kind
    if kind is None:
        return [f"{flag} takes text no reviewer has classified, so this host refuses it"]
    if kind in (FlagKind.CODE, FlagKind.HOST):
        if not config.flag_allowed(spec.names):
            return [
                f"{flag} {REFUSED_BECAUSE[kind]}: refused unless this host lists {spec.flag} in "
                f"{ALLOW_FLAGS_SETTING}"
            ]
        # Allowed by name, a file it names still has to be one of the host's.
        paths = [v for v in used.values if "/" in v and not v.lstrip().startswith(("{", "["))]
        return [p for v in paths if (p := _path_problem(v, f"{flag} file", config))]
    if kind is FlagKind.MODEL:
        return [p for v in used.values if (p := _path_problem(v, "model", config))]
    if kind is FlagKind.NAMED_MODEL:
        problems = []
        for value in used.values:
            if value.lstrip().startswith(("{", "[")):
                problems.append(f"{flag} takes NAME=PATH here, not JSON")
            elif p := _path_problem(value.split("=", 1)[-1], "model", config):
                problems.append(p)
        return problems
    if kind is FlagKind.PATH:
        return [p for v in used.values if (p := _path_problem(v, f"{flag} file", config))]
    problems = []
    for value in used.values:
        if spec.choices is not None and value not in spec.choices:
            problems.append(f"{flag} {value} is not one of {', '.join(spec.choices)}")
        elif spec.number is not None:
            try:
                spec.number(value)
            except ValueError:
                problems.append(f"{flag} {value!r} is not a {spec.number.__name__}")
    return problems


def flag_use_problems(
    launch: Launch, config: WorkerConfig, *, version: str | None
) -> tuple[list[UsedFlag], list[str]]:
    """Read the launch's arguments as its server would and name every flag this host refuses."""
    args = launch.args()
    if launch.launcher.startswith(REPRO_PREFIX):
        parser = repro_parser(launch.launcher[len(REPRO_PREFIX) :])
        if parser is None:
            return [], [f"{launch.launcher} is not a repro program this worker has"]
        specs, who, abbreviations = repro_specs(parser), launch.launcher, True
    else:
        specs = catalog_specs(launch.server, version)
        who = f"{launch.server} {version or '(newest known)'}"
        abbreviations = version is None or version in catalog(launch.server)
    used, problems = read_flags(
        args,
        specs,
        server=launch.server,
        positional_model=launch.launcher in MODEL_POSITIONAL_LAUNCHERS,
        who=who,
        abbreviations=abbreviations,
    )
    for flag in used:
        problems += _value_problems(flag, config)
    if launch.server in PACKAGE_OF_SERVER and not any(
        u.spec.kind is FlagKind.MODEL and u.values for u in used
    ):
        problems.append("the launch names no model: a server would fetch its default one from the network")
    return used, problems


def env_problems(launch: Launch, config: WorkerConfig) -> list[str]:
    problems = []
    for name in launch.env:
        if name in FORCED_ENV:
            problems.append(f"{name} is set by the worker itself and cannot be changed")
        elif name in WORKER_SELECTED_ENV:
            problems.append(f"{name} is set by the worker from its own GPU selection, never by a launch")
        elif not config.env_allowed(name):
            problems.append(f"environment variable {name} is not in this host's allowlist")
    return problems


def _int_option(launch: Launch, *flags: str) -> int:
    for flag in flags:
        option = launch.option(flag)
        if option is not None and option.values and option.values[0].isdigit():
            return int(option.values[0])
    return 1


def gpus_needed(launch: Launch) -> tuple[int, str]:
    """How many GPUs the launch's parallelism asks for, and the flags that say so."""
    tp = _int_option(launch, "--tp-size", "--tensor-parallel-size", "--tp", "-tp")
    pp = _int_option(launch, "--pp-size", "--pipeline-parallel-size", "--pp", "-pp")
    dp = _int_option(launch, "--dp-size", "--data-parallel-size", "--dp", "-dp")
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
    version: str | None = None
    if launch.server in PACKAGE_OF_SERVER:
        version = installed_version(tuple(program), PACKAGE_OF_SERVER[launch.server])
    _, problems = flag_use_problems(launch, config, version=version)
    problems += env_problems(launch, config)
    needed, why = gpus_needed(launch)
    if gpu_count is not None and needed > 1 and needed > gpu_count:
        problems.append(
            f"the launch needs {needed} GPUs ({why}) and {config.host} has {gpu_count}: "
            f"it must run on a host with at least {needed}"
        )
    if problems:
        raise Refused("; ".join(problems))
    return ApprovedLaunch(launch=launch, program=list(program), server_version=version)


def bind(approved: ApprovedLaunch, *, host: str, port: int) -> ApprovedLaunch:
    """The approved launch bound to the worker's address: its own --host/--port (any spelling the
    server reads as them) dropped, the worker's appended last so they win."""
    launch = approved.launch
    owned = {flag_key(f, launch.server) for f in WORKER_OWNED_FLAGS}
    launch = Launch(
        launcher=launch.launcher,
        positional=launch.positional,
        options=tuple(o for o in launch.options if flag_key(o.flag, launch.server) not in owned),
        env=launch.env,
        source=launch.source,
    )
    launch = apply_patch(launch, args={"--host": host, "--port": str(port)}, env={})
    return ApprovedLaunch(launch=launch, program=approved.program, server_version=approved.server_version)

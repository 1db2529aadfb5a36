"""A server launch as data: read it from a log, apply a fix's argument and environment patch, show the
difference, check it against the launch-flag catalog.

A launch is a launcher name plus an argument list and an environment, never a shell string: the GPU
worker maps the launcher name to a program its own configuration allows and runs the list as it is.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatchlab.core.flags import release_for
from dispatchlab.core.serverargs import canonical_sglang_flag

# The programs a launch may start, as their command lines begin, and the launcher names they get.
LAUNCHERS: dict[str, tuple[str, ...]] = {
    "sglang": ("python", "-m", "sglang.launch_server"),
    "sglang-serve": ("sglang", "serve"),
    "vllm": ("vllm", "serve"),
    "vllm-api-server": ("python", "-m", "vllm.entrypoints.openai.api_server"),
}
REPRO_PREFIX = "repro:"
SERVER_OF_LAUNCHER = {
    "sglang": "sglang",
    "sglang-serve": "sglang",
    "vllm": "vllm",
    "vllm-api-server": "vllm",
}
# Never meaningful in an argument list run without a shell; refused so nobody believes they chain.
SHELL_METACHARACTERS = frozenset(";|&$`<>\n\r\x00")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON = re.compile(r"(?:.*/)?python[\d.]*")
# Flags the worker sets itself: it binds the server to a free local port.
WORKER_OWNED_FLAGS = ("--host", "--port")
# A flag whose removal leaves others meaningless: removing the key drops every flag that starts with
# one of its prefixes (the `--speculative-*` values once `--speculative-algorithm` is gone).
ORPHANED_BY: dict[str, tuple[str, ...]] = {
    "speculative_algorithm": ("speculative_",),
    "speculative_config": ("speculative_",),
}
# Fields of an args dump that are outputs of a launch, not inputs worth repeating.
_DUMP_SKIP = {"host", "port", "served_model_name", "tokenizer_path", "model_config", "device"}


class LaunchError(ValueError):
    """A launch cannot be read or is not one dispatchlab runs. The message is for people."""


@dataclass(frozen=True)
class Option:
    flag: str  # "--tp-size"
    values: tuple[str, ...]  # () for a bare flag

    def tokens(self) -> list[str]:
        return [self.flag, *self.values]

    def text(self) -> str:
        return " ".join(shlex.quote(token) for token in self.tokens())


@dataclass(frozen=True)
class Launch:
    launcher: str
    positional: tuple[str, ...] = ()  # `vllm serve MODEL`
    options: tuple[Option, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = "command line"  # or "args dump"

    @property
    def server(self) -> str:
        return SERVER_OF_LAUNCHER.get(self.launcher, "unknown")

    def args(self) -> list[str]:
        return [*self.positional, *(token for option in self.options for token in option.tokens())]

    def option(self, flag: str) -> Option | None:
        key = flag_key(flag, self.server)
        return next((o for o in self.options if flag_key(o.flag, self.server) == key), None)

    def program(self) -> list[str]:
        if self.launcher.startswith(REPRO_PREFIX):
            return ["python", "-m", "worker.repro", self.launcher[len(REPRO_PREFIX) :]]
        return list(LAUNCHERS.get(self.launcher, (self.launcher,)))

    def command(self) -> str:
        """A command line a person can read, edit and paste: one option per line."""
        head = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        first = " ".join([*head, *self.program(), *(shlex.quote(p) for p in self.positional)])
        return " \\\n  ".join([first, *(option.text() for option in self.options)])


def flag_key(flag: str, server: str) -> str:
    name = flag.lstrip("-").replace("-", "_")
    return canonical_sglang_flag(name) if server == "sglang" else name


def _check_tokens(tokens: Sequence[str]) -> None:
    for token in tokens:
        bad = sorted(SHELL_METACHARACTERS.intersection(token))
        if bad:
            shown = ", ".join(repr(c) for c in bad)
            raise LaunchError(
                f"{token[:80]!r} holds the shell metacharacter {shown}: a launch is run as an argument "
                "list without a shell, so pipes, redirections, `;` and `$(...)` cannot be used"
            )


def _split(text: str) -> list[str]:
    text = re.sub(r"\\\r?\n", " ", text)
    try:
        return shlex.split(text, comments=False, posix=True)
    except ValueError as error:
        raise LaunchError(f"the command line cannot be read: {error}") from None


def _launcher_at(tokens: Sequence[str], start: int) -> tuple[str, int] | None:
    """(launcher name, index after it) when a known program starts at tokens[start]."""
    rest = list(tokens[start:])
    if len(rest) >= 3 and _PYTHON.fullmatch(rest[0]) and rest[1] == "-m":
        if rest[2] == "sglang.launch_server":
            return "sglang", start + 3
        if rest[2] == "vllm.entrypoints.openai.api_server":
            return "vllm-api-server", start + 3
        if rest[2] == "worker.repro" and len(rest) >= 4:
            return REPRO_PREFIX + rest[3], start + 4
    if len(rest) >= 2 and rest[0].rsplit("/", 1)[-1] in ("sglang", "vllm") and rest[1] == "serve":
        return ("sglang-serve" if rest[0].endswith("sglang") else "vllm"), start + 2
    return None


def _options(tokens: Sequence[str]) -> tuple[tuple[str, ...], tuple[Option, ...]]:
    positional: list[str] = []
    options: list[Option] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token.partition("=")
            if eq:
                options.append(Option(name, (value,)))
            else:
                values = []
                while i + 1 < len(tokens) and not re.match(r"--?[A-Za-z]", tokens[i + 1]):
                    values.append(tokens[i + 1])
                    i += 1
                options.append(Option(name, tuple(values)))
        elif token.startswith("-") and len(token) == 2 and token[1].isalpha():
            value = tokens[i + 1] if i + 1 < len(tokens) else ""
            options.append(Option(token, (value,) if value else ()))
            i += 1 if value else 0
        elif options:
            raise LaunchError(f"{token!r} follows the options: a positional argument must come first")
        else:
            positional.append(token)
        i += 1
    return tuple(positional), tuple(options)


def launch_from_command(text: str) -> Launch:
    """Read a launch command line (environment assignments, then the program and its arguments).

    Raises LaunchError when it is not one of the launchers dispatchlab runs or uses the shell."""
    tokens = _split(text)
    if not tokens:
        raise LaunchError("the command line is empty")
    _check_tokens(tokens)
    env: dict[str, str] = {}
    i = 1 if tokens[0] == "env" else 0
    while i < len(tokens) and "=" in tokens[i] and ENV_NAME.fullmatch(tokens[i].split("=", 1)[0]):
        name, value = tokens[i].split("=", 1)
        env[name] = value
        i += 1
    found = _launcher_at(tokens, i)
    if found is None:
        program = " ".join(tokens[i : i + 3]) or "(nothing)"
        raise LaunchError(
            f"{program!r} is not a launcher dispatchlab runs: use python -m sglang.launch_server, "
            "sglang serve, vllm serve or python -m worker.repro NAME"
        )
    launcher, after = found
    positional, options = _options(tokens[after:])
    return Launch(launcher=launcher, positional=positional, options=options, env=env)


def check_launch(launch: Launch) -> None:
    """LaunchError when a patched launch holds what a command line may not (metacharacters, names)."""
    _check_tokens([launch.launcher, *launch.args(), *launch.env, *launch.env.values()])
    for name in launch.env:
        if not ENV_NAME.fullmatch(name):
            raise LaunchError(f"{name!r} is not an environment variable name")


def launch_from_spec(spec: Mapping[str, Any]) -> Launch:
    """The contract's LaunchSpec back into a Launch (the worker's side)."""
    launcher = str(spec.get("launcher") or "")
    args = spec.get("args") or []
    env = spec.get("env") or {}
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise LaunchError("the launch's args must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise LaunchError("the launch's env must map names to strings")
    _check_tokens([launcher, *args, *env, *env.values()])
    for name in env:
        if not ENV_NAME.fullmatch(name):
            raise LaunchError(f"{name!r} is not an environment variable name")
    positional, options = _options(args)
    return Launch(launcher=launcher, positional=positional, options=options, env=dict(env))


def _value_tokens(value: Any) -> tuple[str, ...]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    if isinstance(value, dict):
        return (json.dumps(value, separators=(",", ":")),)
    return (str(value),)


def _flags_by_field(server: str, version: str | None) -> dict[str, tuple[str, dict[str, Any]]]:
    by_field: dict[str, tuple[str, dict[str, Any]]] = {}
    for flag, spec in release_for(server, version).items():
        # A dump names fields as the server stores them (`tp_size`), which may be an alias's name.
        names = [
            spec.get("dest"),
            *(name.lstrip("-").replace("-", "_") for name in (flag, *spec.get("aliases", []))),
        ]
        for name in names:
            if name and name not in by_field:
                by_field[name] = (flag, spec)
    return by_field


def launch_from_args_dump(document: Mapping[str, Any]) -> Launch | None:
    """Rebuild an SGLang or vLLM launch from the arguments the log dumped: every argument whose value
    differs from the release's default becomes an option, resolved backends included."""
    server = str(document.get("server") or "")
    args = document.get("server_args") or {}
    if server not in ("sglang", "vllm") or not isinstance(args, dict) or not args:
        return None
    by_field = _flags_by_field(server, document.get("server_version"))
    positional: tuple[str, ...] = ()
    options: list[Option] = []
    model = args.get("model_path") or args.get("model") or document.get("model")
    if server == "vllm" and model:
        positional = (str(model),)
    for name, value in args.items():
        if name in _DUMP_SKIP or value is None or (server == "vllm" and name == "model"):
            continue
        found = by_field.get(name)
        if found is None:
            continue
        flag, spec = found
        if value == spec.get("default"):
            continue
        if isinstance(value, bool):
            if value and spec.get("action") == "store_true":
                options.append(Option(flag, ()))
            continue
        if isinstance(value, (list, dict)) and not value:
            continue
        options.append(Option(flag, _value_tokens(value)))
    if not options and not positional:
        return None
    launcher = "sglang" if server == "sglang" else "vllm"
    return Launch(launcher=launcher, positional=positional, options=tuple(options), source="args dump")


def launch_from_document(document: Mapping[str, Any]) -> Launch | None:
    """The launch a parsed log shows: its command line when it has one, else its args dump."""
    command = document.get("launch_command")
    if isinstance(command, str) and command.strip():
        try:
            return launch_from_command(command)
        except LaunchError:
            pass
    return launch_from_args_dump(document)


def apply_patch(launch: Launch, *, args: Mapping[str, Any], env: Mapping[str, Any]) -> Launch:
    """The launch with a fix applied. In `args`, a value of False or None removes the flag, True sets
    it bare, anything else sets its value(s); in `env`, None or False removes a variable."""
    options = list(launch.options)
    for flag, value in args.items():
        flag = flag if flag.startswith("-") else f"--{flag.replace('_', '-')}"
        key = flag_key(flag, launch.server)
        at = next((i for i, o in enumerate(options) if flag_key(o.flag, launch.server) == key), None)
        if value is False or value is None:
            if at is not None:
                del options[at]
            options = _without_orphans(options, key, launch.server, keep=args)
            continue
        new = Option(options[at].flag if at is not None else flag, _value_tokens(value))
        if at is None:
            options.append(new)
        else:
            options[at] = new
    new_env = dict(launch.env)
    for name, value in env.items():
        if value is None or value is False:
            new_env.pop(name, None)
        else:
            new_env[name] = str(value)
    return Launch(
        launcher=launch.launcher,
        positional=launch.positional,
        options=tuple(options),
        env=new_env,
        source=launch.source,
    )


def _without_orphans(
    options: list[Option], removed: str, server: str, *, keep: Mapping[str, Any]
) -> list[Option]:
    """`options` less those orphaned by removing the flag `removed` (a flag_key); flags the patch
    itself sets to a value are kept."""
    name = removed.lstrip("-").replace("-", "_")
    prefixes = ORPHANED_BY.get(name) or ORPHANED_BY.get(removed) or ()
    if not prefixes:
        return options
    kept_by_patch = {
        (f if f.startswith("-") else f"--{f.replace('_', '-')}").lstrip("-").replace("-", "_")
        for f, v in keep.items()
        if v is not False and v is not None
    }
    return [
        o
        for o in options
        if not (
            (field := o.flag.lstrip("-").replace("-", "_")).startswith(prefixes)
            and field not in kept_by_patch
        )
    ]


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "same" | "added" | "removed" | "changed"
    text: str
    before: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text, "before": self.before}


def launch_diff(before: Launch, after: Launch) -> list[DiffLine]:
    """Option by option (and variable by variable), in the order of the fixed launch."""
    lines: list[DiffLine] = []
    for name in sorted(set(before.env) | set(after.env)):
        old, new = before.env.get(name), after.env.get(name)
        if old == new:
            lines.append(DiffLine("same", f"{name}={new}"))
        elif old is None:
            lines.append(DiffLine("added", f"{name}={new}"))
        elif new is None:
            lines.append(DiffLine("removed", f"{name}={old}"))
        else:
            lines.append(DiffLine("changed", f"{name}={new}", f"{name}={old}"))
    if before.positional != after.positional:
        lines.append(DiffLine("changed", " ".join(after.positional), " ".join(before.positional)))
    for option in after.options:
        old_option = before.option(option.flag)
        if old_option is None:
            lines.append(DiffLine("added", option.text()))
        elif old_option.values != option.values:
            lines.append(DiffLine("changed", option.text(), old_option.text()))
        else:
            lines.append(DiffLine("same", option.text()))
    for option in before.options:
        if after.option(option.flag) is None:
            lines.append(DiffLine("removed", option.text()))
    return lines


def flag_problems(launch: Launch, *, version: str | None) -> list[str]:
    """Options the server's launch-flag catalog (of `version`, else its newest release) does not
    know, and values outside a flag's choices. Empty for a server without a catalog."""
    catalog = release_for(launch.server, version) if launch.server != "unknown" else {}
    if not catalog:
        return []
    known: dict[str, dict[str, Any]] = {}
    for flag, spec in catalog.items():
        for name in (flag, *spec.get("aliases", [])):
            known[flag_key(name, launch.server)] = spec
            known[name.lstrip("-").replace("-", "_")] = spec
    problems = []
    for option in launch.options:
        spec = known.get(flag_key(option.flag, launch.server)) or known.get(
            option.flag.lstrip("-").replace("-", "_")
        )
        if spec is None:
            problems.append(f"unknown flag {option.flag} for {launch.server} {version or '(newest known)'}")
            continue
        choices = spec.get("choices")
        if choices and option.values:
            bad = [v for v in option.values if v not in [str(c) for c in choices]]
            if bad:
                problems.append(f"{option.flag} {bad[0]} is not one of {', '.join(str(c) for c in choices)}")
    return problems

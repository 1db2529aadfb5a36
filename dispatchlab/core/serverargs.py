"""Argument dumps and launch commands: SGLang `ServerArgs(...)`, vLLM `non-default args: {...}` and engine
config, `python -m sglang.launch_server ...` / `vllm serve ...` command lines. Never eval()s."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from dispatchlab.core.lazyre import lazy_compile

_OPAQUE = lazy_compile(r"<[A-Za-z_][\w.]*[ :>]")
_CALL = lazy_compile(r"^(?P<name>[A-Za-z_][\w.]*)\((?P<body>.*)\)$", re.S)
_IDENT = lazy_compile(r"^[A-Za-z_]\w*$")
# (a quoted string with no escape, newline, NUL or lone surrogate, which literal_eval refuses or changes; an int of
# up to 4,000 digits: Python converts no longer one)
_SIMPLE_VALUE = lazy_compile(
    r"(?P<word>True|False|None)\Z|(?P<quoted>'[^'\\\n\r\x00\ud800-\udfff]*'|\"[^\"\\\n\r\x00\ud800-\udfff]*\")\Z|"
    r"(?P<int>-?(?:0|[1-9][0-9]{0,3999}))\Z|-?(?:0|[1-9][0-9]*)\.[0-9]+\Z"
)
_WORDS: dict[str, Any] = {"True": True, "False": False, "None": None}


# What counts outside quotes and `<...>` reprs (brackets and commas), each quoted string or repr one token to
# skip: the regex walks a 15 KB dump in C, where a loop over its characters took milliseconds per dump.
# A quote runs to its closing quote (a backslash escapes the next character) or to the end; a repr from `<`
# and a name to the next `>` or the end.
_TOKEN = lazy_compile(
    r"""'(?:[^'\\]|\\[\s\S])*\\?'?|"(?:[^"\\]|\\[\s\S])*\\?"?|<[A-Za-z_][\w.]*(?:>|[ :][^>]*>?)|[()\[\]{},]"""
)


def _unquoted(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(index, character) of the brackets and commas that lie outside quotes and `<...>` reprs."""
    for token in _TOKEN.finditer(text, start):
        c = token.group()
        if len(c) == 1 and c in "()[]{},":
            yield token.start(), c


def split_top_level(body: str) -> list[str]:
    """Split `k=v, k2=v2` at depth-0 commas, respecting quotes, brackets and `<...>` reprs."""
    parts: list[str] = []
    depth = 0
    begin = 0
    for i, c in _unquoted(body):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth <= 0:
            parts.append(body[begin:i].strip())
            begin = i + 1
    tail = body[begin:].strip()
    if tail:
        parts.append(tail)
    return parts


def _json_safe(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        if isinstance(value, float) and value != value:
            return None
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    return repr(value)


def parse_value(text: str) -> Any:
    text = text.strip()
    if not text:
        return None
    simple = _SIMPLE_VALUE.match(text)
    if simple is not None:  # most of a dump's values: what literal_eval makes of them, without it
        if simple.group("word"):
            return _WORDS[text]
        if simple.group("quoted"):
            return text[1:-1]
        return int(text) if simple.group("int") else float(text)
    import ast  # here and below, not at the top: a log without an arguments dump never needs the parser
    import warnings

    try:
        with warnings.catch_warnings():  # `1and`, `'\d'` in a garbled dump: not worth a warning on stderr
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            return _json_safe(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    m = _CALL.match(text)
    if m and not text.startswith("<"):
        return {"__type__": m.group("name"), **parse_kwargs(m.group("body"))}
    return text


def parse_kwargs(body: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in split_top_level(body):
        key, sep, value = part.partition("=")
        key = key.strip()
        if sep and _IDENT.match(key):
            out[key] = parse_value(value)
    return out


def _matching_paren(text: str, start: int) -> int:
    depth = 1
    for i, c in _unquoted(text, start):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def parse_server_args(text: str) -> tuple[dict[str, Any], bool]:
    """`text` starts at or contains `ServerArgs(`. Returns (fields, complete). A dump cut short keeps
    every whole field before the cut."""
    i = text.find("ServerArgs(")
    if i < 0:
        j = text.find("server_args={")
        return _parse_dict_dump(text[j + len("server_args=") :]) if j >= 0 else ({}, False)
    flat = text[i + len("ServerArgs(") :]
    end = _matching_paren(flat, 0)
    if end >= 0:
        return parse_kwargs(flat[:end]), True
    fields = parse_kwargs(flat)
    if fields:
        # the last field of a truncated dump is probably cut mid-value
        last = next(reversed(fields))
        if isinstance(fields[last], str) and not flat.rstrip().endswith(("'", '"')):
            fields.pop(last)
    return fields, False


def _parse_dict_dump(text: str) -> tuple[dict[str, Any], bool]:
    """Newer SGLang prints `server_args={'model_path': ..., ...}` (a dict, not the dataclass repr)."""
    import ast

    end = _matching_paren(text[1:], 0)
    if end >= 0:
        try:
            value = ast.literal_eval(text[: end + 2])
            if isinstance(value, dict):
                return _json_safe(value), True
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    body = text[1 : end + 1] if end >= 0 else text[1:]
    fields: dict[str, Any] = {}
    for part in split_top_level(body):
        key, sep, value = part.partition(":")
        key = key.strip().strip("'\"")
        if sep and _IDENT.match(key):
            fields[key] = parse_value(value)
    return fields, end >= 0


def parse_vllm_engine_config(text: str) -> dict[str, Any]:
    """`Initializing a V1 LLM engine (v0.11.0) with config: model='x', quantization=fp8, ...`: values may be
    unquoted words; keep what looks like a value."""
    i = text.find("with config:")
    return parse_kwargs(text[i + len("with config:") :] if i >= 0 else text)


def parse_vllm_non_default(text: str) -> dict[str, Any]:
    import ast

    i = text.find("{")
    if i < 0:
        return {}
    end = _matching_paren(text[i + 1 :], 0)
    literal = text[i : i + 1 + end + 1] if end >= 0 else text[i:]
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _parse_dict_dump(literal)[
            0
        ]  # one non-literal value (torch.bfloat16, <function ...>) keeps the rest
    return _json_safe(value) if isinstance(value, dict) else {}


# ---- launch commands ----

LAUNCH_START = lazy_compile(
    r"(?:^|[\s$>#])((?:[\w./-]*python[\d.]*\s+-m\s+sglang\.launch_server|sglang\s+serve|"
    r"[\w./-]*python[\d.]*\s+-m\s+vllm\.entrypoints\.openai\.api_server|vllm\s+serve|"
    r"[\w./-]*python[\d.]*\s+-m\s+sglang\.bench_\w+)\b.*)$"
)


def parse_launch_command(command: str) -> dict[str, Any]:
    """Flags of a launch command as {flag_name_with_underscores: value}; bare flags are True.
    `vllm serve MODEL` records the positional model as `model`."""
    import shlex

    try:
        tokens = shlex.split(command, comments=False, posix=True)
    except ValueError:
        tokens = command.split()
    args: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            key = name.replace("-", "_")
            if eq:
                args[key] = _coerce(value)
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                values = []
                while i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                    values.append(_coerce(tokens[i + 1]))
                    i += 1
                args[key] = values[0] if len(values) == 1 else values
            else:
                args[key] = True
        elif token == "-m" and i + 1 < len(tokens):
            positional.append(tokens[i + 1])
            i += 1
        elif token.startswith("-") and len(token) == 2 and i + 1 < len(tokens):
            args[token[1:]] = _coerce(tokens[i + 1])
            i += 1
        else:
            positional.append(token)
        i += 1
    if "serve" in positional:
        after = positional[positional.index("serve") + 1 :]
        if after and "model" not in args:
            args["model"] = after[0]
    return args


def _coerce(value: str) -> Any:
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    if re.fullmatch(r"-?\d+\.\d*(?:e-?\d+)?", value):
        return float(value)
    if value in ("True", "true"):
        return True
    if value in ("False", "false"):
        return False
    return value


SGLANG_FLAG_ALIASES = {
    "tp": "tp_size",
    "tensor_parallel_size": "tp_size",
    "dp": "dp_size",
    "data_parallel_size": "dp_size",
    "ep": "ep_size",
    "expert_parallel_size": "ep_size",
    "pp": "pp_size",
    "pipeline_parallel_size": "pp_size",
    "model": "model_path",
    "fp8_gemm_backend": "fp8_gemm_runner_backend",
    "fp4_gemm_backend": "fp4_gemm_runner_backend",
}


def canonical_sglang_flag(name: str) -> str:
    return SGLANG_FLAG_ALIASES.get(name, name)

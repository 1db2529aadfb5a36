"""Launch command and argument dumps: SGLang's ServerArgs, vLLM's non-default args and engine config."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, ClassVar

from dispatchlab.core.dumpformat import ARGS_LINE_PREFIX, SUMMARY_LINE_PREFIX
from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract import Hits, group
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.reading import decode_line
from dispatchlab.core.serverargs import (
    parse_launch_command,
    parse_server_args,
    parse_vllm_engine_config,
    parse_vllm_non_default,
)

_ENGINE_CONFIG = r"Initializing a V\d LLM engine \(v(?P<version>[^)]+)\) with config: |LLM engine \(v(?P<version2>[^)]+)\) with config:"
_LAUNCH = (
    r"(?:python[\d.]*\s+-m\s+sglang\.launch_server|sglang\s+serve\s|"
    r"python[\d.]*\s+-m\s+vllm\.entrypoints\.openai\.api_server|(?:^|[\s$>#])vllm\s+serve\s)"
)
_SGLANG_LINE_START = lazy_compile(r"^\[\d{4}-\d\d-\d\d ")
# Variable assignments right before the program (`env A=1 B=2 `), up to where it starts.
ENV_PREFIX = lazy_compile(r"(?:\benv\s+)?(?:\b[A-Za-z_][A-Za-z0-9_]*=\S*\s+)+$")
COMMAND_START = lazy_compile(r"(\S*python[\d.]*\s+-m\s+\S+|sglang\s+serve|vllm\s+serve)")


@lru_cache(maxsize=16)
def _parse_dump_cached(text: str) -> tuple[dict[str, Any], bool]:
    # a server that restarts prints the same 15 KB dump again: parse it once
    return parse_server_args(text)


class Arguments:
    RULES: ClassVar[dict[str, str]] = {
        "args_dump": r"server_args=ServerArgs\(|server_args=\{|^ServerArgs\(",
        "vllm_non_default": r"non-default args: \{",
        "vllm_engine_config": _ENGINE_CONFIG,
        "vllm_version": r"vLLM (?:API )?server version (?P<version>[\w.+-]+)|^vLLM Version\s*: (?P<version2>[\w.+-]+)",
        "launch": _LAUNCH,
        "crash_dump": rf"^{SUMMARY_LINE_PREFIX}\d[\d,]* requests in flight",
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        votes = self.obs.server_votes
        if "args_dump" in hits:
            self._args_dump(line, following)
            return True
        if "crash_dump" in hits:
            self.obs.event(line, "backend", "crash_dump", line.msg[len(SUMMARY_LINE_PREFIX) :])
            return True
        if "vllm_non_default" in hits:
            votes["vllm"] += 5
            self.obs.vllm_args.update(parse_vllm_non_default(line.msg[hits["vllm_non_default"].start() :]))
            self.obs.event(line, "backend", "args", "vLLM non-default args")
            return True
        if "vllm_engine_config" in hits:
            votes["vllm"] += 5
            version = group(hits["vllm_engine_config"], "version", "version2")
            self.obs.version("vllm", version)
            for key, value in parse_vllm_engine_config(line.msg).items():
                self.obs.vllm_args.setdefault(key, value)
            self.obs.event(line, "backend", "engine_config", f"vLLM {version} engine config")
            return True
        if "launch" in hits:
            self._launch(line, following)
        if "vllm_version" in hits:
            self.obs.version("vllm", group(hits["vllm_version"], "version", "version2"))
            votes["vllm"] += 5
        return False

    def _args_dump(self, line: Line, following: bytes) -> None:
        text = line.msg
        fields, complete = _parse_dump_cached(text)
        if not complete and following:
            # hard-wrapped dump (pasted into an issue): re-join following lines until the parentheses balance
            joined = text
            for raw in following.split(b"\n")[:400]:
                piece = decode_line(raw)
                if piece.startswith("[") and _SGLANG_LINE_START.match(piece):
                    break
                joined += piece
                longer, complete = parse_server_args(joined)
                if complete or len(longer) > len(fields):
                    fields = longer
                if complete:
                    break
        obs = self.obs
        obs.server_votes["sglang"] += 10
        if text.startswith(ARGS_LINE_PREFIX) and obs.server_args:
            # a crash dump's arguments (crashdump.py) fill what the log's own dump does not say
            for key, value in fields.items():
                obs.server_args.setdefault(key, value)
        else:
            obs.server_args.update(fields)
            obs.server_args_complete = complete
            obs.dump_line = line.number
        summary = f"ServerArgs dump, {len(fields)} fields" + ("" if complete else " (cut short)")
        if text.startswith(ARGS_LINE_PREFIX):
            summary = f"ServerArgs from an SGLang crash dump, {len(fields)} fields"
        obs.event(line, "backend", "server_args", summary)

    def _launch(self, line: Line, following: bytes) -> None:
        text = line.msg.strip()
        m = COMMAND_START.search(text)
        if not m:
            return
        # Keep the environment prefix (`SGLANG_X=1 python -m ...`): it is part of the launch.
        before = max(0, m.start() - 2000)
        prefix = ENV_PREFIX.search(text, before, m.start())
        command = text[prefix.start() if prefix else m.start() :]
        pieces = iter(following.split(b"\n")[:200])
        while command.rstrip().endswith("\\"):
            raw = next(pieces, None)
            if raw is None:
                break
            piece = re.sub(r"^>\s*", "", decode_line(raw).strip())
            command = command.rstrip()[:-1] + " " + piece
        obs = self.obs
        if obs.launch_command and len(obs.launch_command) >= len(command):
            return
        obs.launch_command = command[:20000]
        obs.launch_args = parse_launch_command(command)
        if "sglang" in command[:80]:
            obs.server_votes["sglang"] += 5
        elif "vllm" in command[:80]:
            obs.server_votes["vllm"] += 5
        obs.event(line, "backend", "launch_command", command[:300])

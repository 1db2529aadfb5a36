"""SGLang's crash dumps (`--crash-dump-folder`), read without ever unpickling them.

At a crash SGLang's tokenizer manager pickles `{"server_args": ServerArgs | None, "requests": [(req, out,
created, finished), ...], "launch_command": "..."}` to `<folder>/<hostname>/crash_dump_<%Y-%m-%d_%H-%M-%S>.pkl`
(`--dump-requests-folder` writes the same shape, named by the time alone). `pickle.load` on an uploaded file
runs whatever it names, so this module walks the opcodes (`pickletools.genops`) through a small stack machine
that knows only data: strings, numbers, containers, the memo. A class or function the pickle names becomes
its dotted name, an object built from one becomes an `Instance` record; nothing is imported or called. The
work is bounded (opcodes, nesting, memo, text bytes); a dump cut short or over a bound gives what was read
before the cut. The facts come out as text lines the log parser already reads: SGLang's own `ServerArgs(...)`
repr, the launch command, and a few lines that say how many requests were in flight.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

from dispatchlab.core.dumpformat import ARGS_LINE_PREFIX as ARGS_LINE_PREFIX
from dispatchlab.core.dumpformat import PICKLE_SUFFIXES as PICKLE_SUFFIXES
from dispatchlab.core.dumpformat import SUMMARY_LINE_PREFIX as SUMMARY_LINE_PREFIX
from dispatchlab.core.dumpformat import looks_like_pickle as looks_like_pickle
from dispatchlab.core.pickle_walk import (
    Global,
    Instance,
    Opaque,
    small_int,
)
from dispatchlab.core.pickle_walk import (
    NotACrashDump as NotACrashDump,
)
from dispatchlab.core.pickle_walk import (
    read_pickle as read_pickle,
)

MAX_DUMP_BYTES = 256 * 1024 * 1024
# How deep the facts look into what was read: enough for dump -> request -> sampling params -> a list.
MAX_VALUE_DEPTH = 12
# And how much: the memo can make a small pickle a huge tree of shared references.
MAX_VALUE_NODES = 100_000
MAX_VALUE_CHARS = 4096  # per string
MAX_REQUESTS = 100_000  # summarised (the last ones: SGLang appends the unfinished requests at the end)
MAX_REQUEST_LINES = 50
PREVIEW_CHARS = 200

_DUMP_NAME = re.compile(r"(?:^|_)(?P<ts>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})\.pkl$")
_SAFE_WORD = re.compile(r"[^\w.:@/+-]")
# What a request's sampling params say that is worth a line: numbers and switches, never user text.
_SAMPLING_KEYS = (
    "max_new_tokens",
    "min_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
)
# The first line of each kind the dump turns into; the parser keys on these.


# ---------------------------------------------------------------- the facts


@dataclass(frozen=True)
class DumpedRequest:
    """One request of the dump, summarised without its text."""

    rid: str | None
    prompt_tokens: int | None
    prompt_chars: int | None
    preview: str | None  # the first PREVIEW_CHARS of the prompt: kept for the API, never put in a line
    batch_size: int
    sampling: dict[str, Any]
    finished: bool
    finish_reason: str | None
    completion_tokens: int | None
    created: float | None  # epoch seconds, as SGLang's time.time()
    ended: float | None  # finished, or when the dump was written for an unfinished request


@dataclass(frozen=True)
class CrashDump:
    name: str
    kind: str  # "crash dump" (--crash-dump-folder) | "request dump" (--dump-requests-folder)
    hostname: str | None
    written: str | None  # "YYYY-MM-DD HH:MM:SS", the server's local time, from the file name
    server_args: dict[str, Any] | None
    server_args_class: str | None
    launch_command: str | None
    requests: list[DumpedRequest]  # the last MAX_REQUESTS
    request_count: int
    complete: bool
    stopped: str | None

    @property
    def unfinished(self) -> int:
        return sum(1 for r in self.requests if not r.finished)


_KEPT_NO_MORE = "<more than the reader keeps>"


class _Plain:
    """JSON-able copies of what was read, bounded in depth, nodes and string length: a hostile pickle can
    nest a list a million deep, put a list inside itself, or share one list a thousand times a level."""

    def __init__(self) -> None:
        self.nodes_left = MAX_VALUE_NODES

    def __call__(self, value: Any, depth: int = 0) -> Any:
        self.nodes_left -= 1
        if self.nodes_left < 0:
            return _KEPT_NO_MORE
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "…"
        if isinstance(value, int):
            return value if small_int(value) else f"<int of {value.bit_length()} bits>"
        if isinstance(value, float):
            return value if math.isfinite(value) else str(value)
        if isinstance(value, bytes):
            return f"<{len(value)} bytes>"
        if depth >= MAX_VALUE_DEPTH:
            return "<nested too deep>"
        if isinstance(value, dict):
            return self._entries(value.items(), depth)
        if isinstance(value, (list, tuple)):
            return self._items(value, depth)
        if isinstance(value, Global):
            return f"<{value.name}>"
        if isinstance(value, Opaque):
            return f"<{value.what}>"
        if isinstance(value, Instance):
            return self._instance(value, depth)
        return f"<{type(value).__name__}>"

    def _instance(self, value: Instance, depth: int) -> Any:
        fields = value.fields()
        # an enum member pickles as Class(value): keep the value, named like Python's repr of a member
        if not fields and isinstance(value.args, tuple) and len(value.args) == 1:
            inner = value.args[0]
            if inner is None or isinstance(inner, (str, float, bool)) or small_int(inner):
                return f"<{value.class_name}: {self(inner)!r}>"
        return {"__class__": value.class_name, **self._entries(fields.items(), depth)}

    # Each stops at the first child past the budget: one visit more per container, however wide.
    def _items(self, values: Iterable[Any], depth: int) -> list[Any]:
        out: list[Any] = []
        for value in values:
            if self.nodes_left <= 0:
                out.append(_KEPT_NO_MORE)
                break
            out.append(self(value, depth + 1))
        return out

    def _entries(self, pairs: Iterable[tuple[Any, Any]], depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if self.nodes_left <= 0:
                out["…"] = _KEPT_NO_MORE
                break
            out[str(key)] = self(value, depth + 1)
        return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int | None:
    return value if small_int(value) and value >= 0 else None


def _first(value: Any) -> Any:
    """A batched request holds lists: the first item speaks for the batch."""
    return value[0] if isinstance(value, list) and value else value


def _request(entry: Any) -> DumpedRequest | None:
    if not isinstance(entry, (tuple, list)) or not entry:
        return None
    obj = entry[0]
    if not isinstance(obj, (Instance, dict)):
        return None
    fields = obj.fields() if isinstance(obj, Instance) else obj
    out = entry[1] if len(entry) > 1 and isinstance(entry[1], dict) else {}
    meta_info = out.get("meta_info")
    meta: dict[Any, Any] = meta_info if isinstance(meta_info, dict) else {}
    text, input_ids = fields.get("text"), fields.get("input_ids")
    batch_size = len(text) if isinstance(text, list) else 1
    text = _first(text)
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        batch_size = max(batch_size, len(input_ids))
        input_ids = input_ids[0]
    prompt_tokens = len(input_ids) if isinstance(input_ids, list) else _count(meta.get("prompt_tokens"))
    sampling_raw = _first(fields.get("sampling_params"))
    sampling: dict[str, Any] = {}
    if isinstance(sampling_raw, dict):
        for key in _SAMPLING_KEYS:
            value = sampling_raw.get(key)
            if (
                isinstance(value, bool)
                or small_int(value)
                or (isinstance(value, float) and math.isfinite(value))
            ):
                sampling[key] = value
        stop = sampling_raw.get("stop")
        stops = len(stop) if isinstance(stop, list) else 1 if isinstance(stop, str) else 0
        if stops:
            sampling["stop"] = f"<{stops} string{'s' if stops > 1 else ''}>"
    reason = meta.get("finish_reason")
    reason_type = reason.get("type") if isinstance(reason, dict) else reason
    rid = _first(fields.get("rid")) or meta.get("id")
    return DumpedRequest(
        rid=_safe(str(rid), 64) if isinstance(rid, str) or small_int(rid) else None,
        prompt_tokens=prompt_tokens,
        prompt_chars=len(text) if isinstance(text, str) else None,
        preview=text[:PREVIEW_CHARS] if isinstance(text, str) else None,
        batch_size=batch_size,
        sampling=sampling,
        finished=reason is not None,
        finish_reason=_safe(str(reason_type), 40) if isinstance(reason_type, str) else None,
        completion_tokens=_count(meta.get("completion_tokens")),
        created=_number(entry[2]) if len(entry) > 2 else None,
        ended=_number(entry[3]) if len(entry) > 3 else None,
    )


def _safe(text: str, limit: int) -> str:
    """A name from the dump shown in a line: no spaces, quotes or control characters, bounded."""
    return _SAFE_WORD.sub("_", text)[:limit]


def _dump_place(name: str) -> tuple[str, str | None, str | None]:
    """(kind, hostname, written) from the file's path: `<folder>/<hostname>/crash_dump_<ts>.pkl`."""
    path = PurePosixPath(name.replace("\\", "/").split(":")[-1])
    match = _DUMP_NAME.search(path.name)
    written = None
    if match:
        day, _, clock = match.group("ts").partition("_")
        written = f"{day} {clock.replace('-', ':')}"
    crash = path.name.startswith("crash_dump")
    parent = path.parent.name if crash and len(path.parts) > 1 else ""
    # a bare number is the web's per-upload folder, not a host
    hostname = _safe(parent, 64) if parent and parent not in (".", "..") and not parent.isdigit() else None
    return ("crash dump" if crash or not match else "request dump"), hostname, written


def read_crash_dump(data: bytes, name: str) -> CrashDump:
    """The facts of a dump. NotACrashDump (one line, for people) when the pickle is something else."""
    if len(data) > MAX_DUMP_BYTES:
        raise NotACrashDump(f"the file is larger than {MAX_DUMP_BYTES:,} bytes")
    read = read_pickle(data)
    top = read.value
    if not isinstance(top, dict) or not ({"server_args", "requests"} & set(top)):
        what = f"a dict of {sorted(map(str, top))[:5]}" if isinstance(top, dict) else _describe(top)
        cut = f"; {read.stopped}" if read.stopped else ""
        raise NotACrashDump(f"the pickle holds {what}, not SGLang's server_args and requests{cut}")
    args = top.get("server_args")
    server_args: dict[str, Any] | None = None
    args_class = None
    plain = _Plain()
    if isinstance(args, Instance):
        args_class = args.class_name
        # only SGLang's dataclass is taken for arguments; any other object stays a name
        if args.class_name.rpartition(".")[2] == "ServerArgs":
            server_args = plain(args.fields(), 1)
    elif isinstance(args, dict):
        server_args = plain(args, 1)
    raw_requests = top.get("requests")
    entries = raw_requests if isinstance(raw_requests, (list, tuple)) else []
    requests = [r for r in map(_request, entries[-MAX_REQUESTS:]) if r is not None]
    command = top.get("launch_command")
    kind, hostname, written = _dump_place(name)
    return CrashDump(
        name=PurePosixPath(name.replace("\\", "/")).name,
        kind=kind,
        hostname=hostname,
        written=written,
        server_args=server_args,
        server_args_class=args_class,
        launch_command=command[:20000] if isinstance(command, str) else None,
        requests=requests,
        request_count=len(entries) - min(len(entries), MAX_REQUESTS) + len(requests),
        complete=read.complete,
        stopped=read.stopped,
    )


def _describe(value: Any) -> str:
    if isinstance(value, Instance):
        return f"an object of {value.class_name}"
    if isinstance(value, Global):
        return f"a reference to {value.name}"
    return f"a {type(value).__name__}"


# ---------------------------------------------------------------- the lines


def _repr_value(value: Any) -> str:
    """A value as SGLang's dataclass repr prints it, for serverargs.parse_kwargs (which literal_evals it)."""
    if isinstance(value, dict) and "__class__" in value:
        return f"<{value['__class__']}>"
    if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
        return value  # a placeholder: stays opaque, as SGLang's own `<torch.dtype ...>` reprs do
    return repr(value)


def _launch_line(command: str) -> str:
    """SGLang records `" ".join(sys.argv)`: `.../sglang/launch_server.py --model-path ...`. Say it the way
    a launch is written, so the parser reads its flags."""
    head, _, rest = command.strip().partition(" ")
    if head.endswith("sglang/launch_server.py"):
        return f"python -m sglang.launch_server {rest}".rstrip()
    if PurePosixPath(head).name == "sglang":
        return f"sglang {rest}".rstrip()
    return command.strip()


def _utc(seconds: float | None) -> str | None:
    if seconds is None or not 0 < seconds < 10**11:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _request_words(request: DumpedRequest) -> str:
    words = [f"rid={request.rid}" if request.rid else "rid unknown"]
    if request.batch_size > 1:
        words.append(f"batch of {request.batch_size}")
    if request.prompt_tokens is not None:
        words.append(f"prompt {request.prompt_tokens:,} tokens")
    elif request.prompt_chars is not None:
        words.append(f"prompt {request.prompt_chars:,} characters")
    words.extend(f"{key}={value}" for key, value in request.sampling.items())
    return ", ".join(words)


def crash_dump_lines(dump: CrashDump) -> list[str]:
    """The dump as log lines: SGLang's `server_args=ServerArgs(...)` repr and launch command (read as in a
    log), then what the dump alone says. No prompt text: it is the users' data, and a prompt that quotes an
    error would be read as one."""
    stamp = f"[{dump.written}] " if dump.written else ""
    host = f" from host {dump.hostname}" if dump.hostname else ""
    written = f", written {dump.written} (server time)" if dump.written else ""
    lines = [f"{stamp}SGLang {dump.kind} {_safe(dump.name, 200)}{host}{written}"]
    if dump.stopped:
        lines.append(f"{stamp}{SUMMARY_LINE_PREFIX}partly read: {dump.stopped}")
    if dump.server_args is not None:
        body = ", ".join(f"{key}={_repr_value(value)}" for key, value in dump.server_args.items())
        lines.append(f"{stamp}{ARGS_LINE_PREFIX}ServerArgs({body})")
    else:
        why = (
            f"a {_safe(dump.server_args_class, 120)} object instead"
            if dump.server_args_class
            else "SGLang could not pickle them"
        )
        lines.append(f"{stamp}{SUMMARY_LINE_PREFIX}no server_args in the dump ({why})")
    if dump.launch_command:
        lines.append(f"{stamp}crash dump launch command: {_launch_line(dump.launch_command)}")
    requests, total = dump.requests, dump.request_count
    finished = total - dump.unfinished
    at = f" at {dump.written}" if dump.written else ""
    summary = (
        f"{stamp}{SUMMARY_LINE_PREFIX}{total:,} requests in flight{at} "
        f"({dump.unfinished:,} unfinished, {finished:,} finished in the minutes before)"
    )
    if requests:
        last = max(requests, key=lambda r: r.created or 0.0)
        summary += f"; last request {_request_words(last)}"
    lines.append(summary)
    shown = requests[-MAX_REQUEST_LINES:]
    if total > len(shown):
        lines.append(f"{stamp}crash dump requests: the last {len(shown)} of {total:,} follow")
    for number, request in enumerate(shown, start=total - len(shown) + 1):
        state = f"finished ({request.finish_reason})" if request.finished else "unfinished"
        words = [_request_words(request), state]
        if request.completion_tokens is not None:
            words.append(f"{request.completion_tokens:,} tokens generated")
        created, ended = _utc(request.created), _utc(request.ended)
        if created:
            words.append(f"created {created}")
        if created and ended and request.created is not None and request.ended is not None:
            words.append(
                f"{'ran' if request.finished else 'running'} {request.ended - request.created:.1f} s"
            )
        lines.append(f"{stamp}crash dump request {number}/{total}: {', '.join(words)}")
    return lines


def crash_dump_text(data: bytes, name: str) -> bytes:
    """The lines a dump reads as, newline-terminated UTF-8: what the log reader hands the parser."""
    return "".join(
        line.replace("\n", " ") + "\n" for line in crash_dump_lines(read_crash_dump(data, name))
    ).encode("utf-8", "replace")

"""What marks an SGLang crash dump and the lines it is read into: cheap to import, so reading a plain log
never loads the pickle walker (dispatchlab.core.crashdump) until a dump is actually there."""

from __future__ import annotations

PICKLE_SUFFIXES = (".pkl", ".pickle")
PROTOCOL_HEADERS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ARGS_LINE_PREFIX = "crash dump server_args="
SUMMARY_LINE_PREFIX = "crash dump: "


def looks_like_pickle(head: bytes, name: str) -> bool:
    """A file the reader takes: named `*.pkl` / `*.pickle` and opening with a protocol 2-5 header."""
    return head.startswith(PROTOCOL_HEADERS) and name.lower().endswith(PICKLE_SUFFIXES)

"""Claim tokens that say which process holds a report, so a claim whose process is gone is taken over
at once instead of after DISPATCHLAB_STALE_CLAIM_SECONDS.

A token (32 characters, the width of `Report.claim_token`) is 8 random hex digits, then a digest of this
machine (boot id and pid namespace), the holder's pid, and a digest of (machine, pid, process start time).
Another process on the same machine and in the same pid namespace can then tell for sure that the holder
is dead: its pid is gone, a zombie, or a newer process with another start time. Anywhere else (another
host or container, a token of an older version, no /proc) nothing is known, and the stale-claim window
decides as before.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from functools import lru_cache
from pathlib import Path

_PROC = Path("/proc")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@lru_cache(maxsize=1)
def _machine() -> str | None:
    """Who can see our pids: the kernel's boot, the pid namespace. None without /proc."""
    try:
        boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(_PROC / "self/ns/pid")
    except OSError:
        return None
    return _digest(f"{boot} {namespace}")


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks after boot); None when it is gone or a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # the name, in parentheses, may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _identity(machine: str, pid: int, started: str) -> str:
    return _digest(f"{machine} {pid} {started}")


def new_claim_token() -> str:
    """A token for a claim held by this process."""
    machine, pid = _machine(), os.getpid()
    started = _started(pid) if machine else None
    if machine is None or started is None:
        return secrets.token_hex(16)
    return f"{secrets.token_hex(4)}{machine}{pid:08x}{_identity(machine, pid, started)}"


def claim_holder_is_dead(token: str) -> bool:
    """True only when the token's process is known to be gone (see the module's docstring)."""
    machine = _machine()
    if machine is None or len(token) != 32 or token[8:16] != machine:
        return False
    try:
        pid = int(token[16:24], 16)
    except ValueError:
        return False
    if pid == os.getpid():
        return False  # ourselves: alive, whatever the digest says
    started = _started(pid)
    return started is None or _identity(machine, pid, started) != token[24:]

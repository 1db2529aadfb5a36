"""FlashInfer's download-at-first-use kernels (the trtllm-gen cubins of its MoE, FP4 GEMM and attention
paths): `flashinfer_artifacts()` says whether they can be had on this host without waiting on a download
that cannot succeed: a matching `flashinfer-cubin` installed, `FLASHINFER_CUBIN_DIR` set to a populated
folder, or the download host of FlashInfer's own configured base URL answering a plain TCP connect within
2 s. Nothing is downloaded; worker.inventory carries the answer (and re-exports these names).
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from worker.versions import package_versions

ARTIFACT_CONNECT_TIMEOUT_S = 2.0
# FlashInfer's default, read from flashinfer/jit/cubin_loader.py when FlashInfer is installed; this copy
# (FlashInfer 0.6.1) is used only when that file cannot be read.
FLASHINFER_DEFAULT_REPOSITORY = (
    "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/"
)
_REPOSITORY_IN_SOURCE = re.compile(
    r"FLASHINFER_CUBINS_REPOSITORY\s*=\s*os\.environ\.get\(\s*['\"]FLASHINFER_CUBINS_REPOSITORY['\"]\s*,"
    r"\s*['\"]([^'\"]+)['\"]"
)
_COUNT_CAP = 100_000  # files counted in a cubin folder before giving up counting

Resolver = Callable[[str, int], list[tuple[Any, ...]]]  # socket.getaddrinfo's shape
Connector = Callable[[int, tuple[Any, ...], float], None]  # family, address, seconds left


class ArtifactState(StrEnum):
    AVAILABLE = "available"  # a matching flashinfer-cubin, a populated FLASHINFER_CUBIN_DIR, or the host
    MISSING = "missing_artifacts"  # none of those: a download-at-first-use kernel would wait, then fail
    VERSION_MISMATCH = "version_mismatch"  # flashinfer-cubin / -jit-cache of another version: import fails
    NOT_INSTALLED = "not_installed"  # no FlashInfer at all


@dataclass
class ArtifactStatus:
    """Whether FlashInfer's download-at-first-use kernels (the trtllm-gen cubins) can be had here."""

    state: ArtifactState
    flashinfer: str | None = None  # flashinfer-python's version
    cubin_package: str | None = None  # flashinfer-cubin's version, when installed
    jit_cache_package: str | None = None  # flashinfer-jit-cache's version, when installed
    cubin_dir: str | None = None  # FLASHINFER_CUBIN_DIR as set
    cubin_dir_files: int | None = None  # files under it
    download_url: str | None = None  # FlashInfer's configured base URL for cubins
    download_url_from: str | None = None  # where that URL was read
    download_host: str | None = None  # host:port the URL names
    reachable: bool | None = None  # None: not checked (not needed, or nothing to connect to)
    reach_detail: str | None = None  # how the TCP connect went, or why it was not tried
    source: str | None = None  # what makes the kernels available
    reason: str | None = None  # why they are not
    fix: str | None = None  # what to install or set

    @property
    def available(self) -> bool:
        return self.state == ArtifactState.AVAILABLE

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = str(self.state)
        data["available"] = self.available
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArtifactStatus:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in data.items() if k in known}
        values["state"] = ArtifactState(values.get("state", ArtifactState.MISSING))
        return cls(**values)

    def summary(self) -> str:
        """One line for people: 'FlashInfer downloaded kernels: <state>: <source or reason> (fix: ...)'."""
        head = f"FlashInfer download-at-first-use kernels: {self.state}"
        if self.available:
            return f"{head} ({self.source})"
        text = f"{head}: {self.reason}" if self.reason else head
        return f"{text}; fix: {self.fix}" if self.fix else text


def flashinfer_artifacts(
    *,
    environ: Mapping[str, str] | None = None,
    versions: Mapping[str, str | None] | None = None,
    resolve: Resolver | None = None,
    connect: Connector | None = None,
    timeout_s: float = ARTIFACT_CONNECT_TIMEOUT_S,
) -> ArtifactStatus:
    """What FlashInfer would find for a kernel it downloads at first use, decided in at most `timeout_s`
    (one plain TCP connect to the host of FlashInfer's configured base URL, only when nothing local
    provides the kernels). Never raises; nothing is downloaded."""
    env = os.environ if environ is None else environ
    found = package_versions() if versions is None else versions
    status = ArtifactStatus(
        ArtifactState.MISSING,
        flashinfer=found.get("flashinfer"),
        cubin_package=found.get("flashinfer-cubin"),
        jit_cache_package=found.get("flashinfer-jit-cache"),
    )
    version = status.flashinfer
    if version is None:
        status.state, status.reason = ArtifactState.NOT_INSTALLED, "flashinfer-python is not installed"
        status.reach_detail = "not checked: no FlashInfer"
        return status
    status.fix = fix_for(version)
    mismatched = [
        f"{name} {other}"
        for name, other in (
            ("flashinfer-cubin", status.cubin_package),
            ("flashinfer-jit-cache", status.jit_cache_package),
        )
        if other is not None and _public(other) != _public(version)
    ]
    if mismatched and not env.get("FLASHINFER_DISABLE_VERSION_CHECK"):
        status.state = ArtifactState.VERSION_MISMATCH
        status.reason = (
            f"{' and '.join(mismatched)} installed beside flashinfer {version}: FlashInfer refuses to load"
        )
        status.reach_detail = "not checked: the installed packages decide"
        return status
    if status.cubin_package is not None:
        status.state = ArtifactState.AVAILABLE
        status.source = f"flashinfer-cubin {status.cubin_package} installed (flashinfer {version})"
        status.reach_detail = "not checked: the cubins are installed"
        return status
    cubin_dir = env.get("FLASHINFER_CUBIN_DIR")
    notes = []
    if cubin_dir:
        status.cubin_dir, status.cubin_dir_files = cubin_dir, _count_files(Path(cubin_dir))
        if status.cubin_dir_files:
            status.state = ArtifactState.AVAILABLE
            status.source = f"FLASHINFER_CUBIN_DIR={cubin_dir} holds {status.cubin_dir_files} files"
            status.reach_detail = "not checked: FLASHINFER_CUBIN_DIR is populated"
            return status
        notes.append(f"FLASHINFER_CUBIN_DIR={cubin_dir} is empty or missing")
    else:
        notes.append("no flashinfer-cubin package and FLASHINFER_CUBIN_DIR is not set")
    url, status.download_url_from = flashinfer_repository(env)
    status.download_url = url
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):  # FlashInfer copies from a local repository path
        local = Path(parts.path or url)
        status.reach_detail = f"local repository {local}: {'exists' if local.is_dir() else 'missing'}"
        status.reachable = local.is_dir()
    elif not parts.hostname:
        status.reach_detail = f"cannot tell a host from {url!r}"
    else:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        status.download_host = f"{parts.hostname}:{port}"
        status.reachable, status.reach_detail = reach(
            parts.hostname, port, timeout_s=timeout_s, resolve=resolve, connect=connect
        )
    if status.reachable:
        status.state = ArtifactState.AVAILABLE
        status.source = (
            f"{status.download_host or url} reachable ({status.reach_detail}): FlashInfer downloads each "
            "cubin at first use"
        )
        return status
    status.reason = f"{'; '.join(notes)}; download host {status.download_host or url}: {status.reach_detail}"
    return status


def fix_for(version: str) -> str:
    """What makes FlashInfer's downloaded kernels available on an offline host."""
    return (
        f"pip install flashinfer-cubin=={version} (a wheel fetched with `pip download "
        f"flashinfer-cubin=={version}` where there is network), or set FLASHINFER_CUBIN_DIR to a folder of "
        f"FlashInfer {version}'s cubins; flashinfer-jit-cache=={version} also spares the JIT builds"
    )


def flashinfer_repository(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """FlashInfer's base URL for cubins and where it was read: FLASHINFER_CUBINS_REPOSITORY, else the
    default in the installed flashinfer/jit/cubin_loader.py (read as text: importing flashinfer imports
    torch), else this module's copy of it."""
    env = os.environ if environ is None else environ
    if env.get("FLASHINFER_CUBINS_REPOSITORY"):
        return env["FLASHINFER_CUBINS_REPOSITORY"], "FLASHINFER_CUBINS_REPOSITORY"
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "jit" / "cubin_loader.py"
        try:
            m = _REPOSITORY_IN_SOURCE.search(path.read_text(encoding="utf-8"))
        except OSError:
            continue
        if m:
            return m.group(1), str(path)
    return FLASHINFER_DEFAULT_REPOSITORY, "dispatchlab's copy of FlashInfer 0.6.1's default"


def reach(
    host: str,
    port: int,
    *,
    timeout_s: float = ARTIFACT_CONNECT_TIMEOUT_S,
    resolve: Resolver | None = None,
    connect: Connector | None = None,
) -> tuple[bool, str]:
    """A plain TCP connect to host:port, name resolution included, in at most `timeout_s` (getaddrinfo
    has no timeout of its own, so it runs in a daemon thread that is abandoned past the limit)."""
    resolver: Resolver = resolve or (lambda h, p: socket.getaddrinfo(h, p, type=socket.SOCK_STREAM))
    connector: Connector = connect or _tcp_connect
    started = time.monotonic()
    box: dict[str, Any] = {}

    def lookup() -> None:
        try:
            box["addresses"] = resolver(host, port)
        except OSError as error:
            box["error"] = error

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False, f"resolving {host} took longer than {timeout_s:g} s"
    if "error" in box:
        return False, f"cannot resolve {host}: {box['error']}"
    last = "no address"
    for family, _type, _proto, _name, address in box.get("addresses") or []:
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            return False, f"no TCP connection to {host}:{port} within {timeout_s:g} s"
        try:
            connector(family, address, left)
        except OSError as error:
            last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            continue
        return True, f"TCP connect to {host}:{port} in {time.monotonic() - started:.2f} s"
    return False, f"no TCP connection to {host}:{port} ({last})"


def _tcp_connect(family: int, address: tuple[Any, ...], timeout_s: float) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(address)


def _public(version: str) -> str:
    """A version without its local part (0.6.1+cu129 -> 0.6.1), as FlashInfer compares them."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def _count_files(folder: Path) -> int:
    count = 0
    try:
        for _root, _dirs, files in os.walk(folder):
            count += len(files)
            if count >= _COUNT_CAP:
                break
    except OSError:
        return 0
    return count

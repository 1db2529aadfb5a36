"""CUDA core dumps: what the driver prints when `CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1` catches a GPU exception
(with `CUDA_COREDUMP_SHOW_PROGRESS=1`), and cuda-gdb's first frame when the dump is opened.

The exception line (`coredump: Detected an exception of type CUDA_EXCEPTION_14 (Warp Illegal Address)`) is
the fatal GPU fault; the kernel it names (`coredump: - Kernel: void flashinfer::...(...)`, or cuda-gdb's
`#0 ... in <kernel><<<(grid),(block)>>>`) is the faulting kernel, added to the document's kernels.
"""

from __future__ import annotations

import re
from typing import ClassVar

from dispatchlab.core.parse.extract import Hits
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import ErrorLine
from dispatchlab.core.parse.observations import FatalLine, Observations
from dispatchlab.core.parse.vocabulary import MAX_MESSAGE

_MAX_KERNEL = 200


def kernel_name(signature: str) -> str:
    """`void ns::Kernel<T, 2u>(ns::Params<T>)` -> `ns::Kernel<T, 2u>`: the name without return type and
    parameters, as the document's other kernel names are."""
    name = re.sub(r"^(?:void|__global__)\s+", "", signature.strip())
    depth = 0
    for index, char in enumerate(name):
        if char == "<":
            depth += 1
        elif char == ">":
            depth -= 1
        elif char == "(" and depth <= 0:
            name = name[:index]
            break
    return name.strip()[:_MAX_KERNEL]


class CoreDump:
    RULES: ClassVar[dict[str, str]] = {
        "coredump_exception": r"coredump: Detected an exception of type (?P<code>CUDA_EXCEPTION_\d+)(?: \((?P<what>[^)]*)\))?",
        "coredump_kernel": r"coredump: -? ?Kernel: (?P<kernel>\S.*)$",
        "cudagdb_frame": r"^#0 +(?:0x[0-9a-f]+ in )?(?P<kernel>\S.*?)<<<\(",
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        obs = self.obs
        for rule in ("coredump_kernel", "cudagdb_frame"):
            if rule in hits:
                name = kernel_name(hits[rule].group("kernel"))
                if name:
                    obs.kernels.setdefault(name, None)
                return True
        if "coredump_exception" in hits:
            text = line.msg.strip()
            if text not in obs.errors:
                ranks = [line.rank] if line.rank else []
                obs.errors[text] = ErrorLine(
                    line.number, line.rank, ranks, "cuda_error", text[:MAX_MESSAGE], 1, line.time, True
                )
                obs.fatal_lines.append(FatalLine(line.number, line.rank, "cuda_error", text))
                obs.event(line, "error", "cuda_error", text[:300])
            return True
        return False

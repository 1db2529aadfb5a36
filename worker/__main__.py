"""`python -m worker`: report the GPU architecture and the queues this host would serve."""

from __future__ import annotations

import os
import sys

from dispatchlab.core.arch import arch_from_capability, arch_from_gpu_name


def detect_gpus() -> list[tuple[str, str | None]]:
    """(name, arch) of each visible NVIDIA GPU, via NVML; empty when there is none or no pynvml."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        print("pynvml is not installed: pip install 'dispatchlab[gpu]'", file=sys.stderr)
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        print(f"no NVIDIA driver reachable: {error}", file=sys.stderr)
        return []
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        gpus.append((name, arch_from_capability(f"{major}.{minor}") or arch_from_gpu_name(name)))
    return gpus


def main() -> int:
    gpus = detect_gpus()
    arches = sorted({arch for _, arch in gpus if arch})
    for index, (name, arch) in enumerate(gpus):
        print(f"GPU {index}: {name} ({arch or 'unknown arch'})")
    queues = ["gpu", *(f"gpu.{arch}" for arch in arches)]
    print(
        f"broker {os.environ.get('DISPATCHLAB_BROKER_URL', '(DISPATCHLAB_BROKER_URL not set)')}; queues {', '.join(queues)}"
    )
    print("re-running launches and kernel benchmarks is not part of this release yet", file=sys.stderr)
    return 2 if not gpus else 0


if __name__ == "__main__":
    sys.exit(main())

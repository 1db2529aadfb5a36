"""GPU architecture from compute capability, GPU names and arch strings in a log."""

from __future__ import annotations

import re

from dispatchlab.core.lazyre import lazy_compile

# First match wins; names are tested with "_" replaced by " ".
_GPU_NAME_TABLE: list[tuple[re.Pattern[str], str]] = [
    (lazy_compile(p, re.I), arch)
    for p, arch in [
        (r"\bGB10\b|DGX Spark", "sm_121"),
        (
            r"RTX PRO \d+ Blackwell|RTX PRO 6000|RTX 50\d0|RTX 5090|Blackwell Max-Q|Blackwell Server Edition|"
            r"Blackwell Workstation|GeForce RTX 50",
            "sm_120",
        ),
        (r"\bThor\b", "sm_110"),
        (r"\bG?B300\b", "sm_103"),
        (r"\bG?B200\b|\bB100\b", "sm_100"),
        (r"\bG?H100\b|\bH200\b|\bH800\b|\bH20\b|\bGH200\b|\bH100 NVL\b", "sm_90"),
        (r"\bL40S?\b|\bL4\b|\bL20\b|RTX 40\d0|RTX 6000 Ada|RTX \d+ Ada", "sm_89"),
        (r"\bOrin\b", "sm_87"),
        (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|RTX 30\d0|RTX A\d+|\bA6000\b", "sm_86"),
        (r"\bA100\b|\bA800\b|\bA30\b", "sm_80"),
        (r"\bT4\b|RTX 20\d0|Quadro RTX|TITAN RTX", "sm_75"),
        (r"\bV100\b|TITAN V", "sm_70"),
        (r"\bP100\b", "sm_60"),
        (r"MI355|MI350", "gfx950"),
        (r"MI300|MI325", "gfx942"),
        (r"MI250|MI210", "gfx90a"),
    ]
]

ROCM_NAME = lazy_compile(r"\bMI\d{3}|Instinct|Radeon|gfx\d", re.I)


def arch_from_gpu_name(name: str | None) -> str | None:
    if not name:
        return None
    probe = name.replace("_", " ")
    for pattern, arch in _GPU_NAME_TABLE:
        if pattern.search(probe):
            return arch
    return None


def arch_from_capability(capability: str | None, *, rocm: bool = False) -> str | None:
    """'12.0' -> 'sm_120'. ROCm reports gfx90a as 9.0: never read that as Hopper."""
    if not capability or rocm:
        return None
    m = re.match(r"^\s*(\d{1,2})\.(\d)\s*$", capability)
    if not m:
        return None
    return f"sm_{int(m.group(1))}{m.group(2)}"


def normalise_arch(token: str) -> str | None:
    """'sm_120', 'sm120a', 'SM 120', 'Sm100', 'sm100f', 'compute_90' -> 'sm_120' / 'sm_100' / 'sm_90'."""
    m = re.search(r"(?:sm|compute)[ _]?(\d{2,3})[afk]?", token, re.I)
    if not m:
        return None
    return f"sm_{m.group(1)}"


# AMD names its archs by gfx target (gfx90a MI250, gfx942 MI300, gfx950 MI355, gfx1100 RX 7900, gfx1201 R9700)
AMD_ARCH = lazy_compile(r"\bgfx(?:9\d[0-9a-f]|1[0-2]\d[0-9a-f])\b")
# where a gfx target is the running device's: rocminfo, torch's gcnArchName, a HIP code object built for
# it, a compile for it, the ROCm arch the build was told to target
_AMD_DEVICE = lazy_compile(
    r"Name:\s*gfx|gcnArchName|amdhsa--gfx|compil\w* for gfx|ROCM_ARCH\W{0,4}gfx|[Dd]etected\b[^\n]{0,40}gfx|"
    r"(?:device|GPU|arch(?:itecture)?)\W{0,4}gfx|on gfx|for gfx"
)


def amd_arch(msg: str) -> tuple[str, int] | None:
    """The gfx target a line names and how sure that it is the device's (2: a device or build-for statement,
    1: a mention in an error or a path). A line naming several targets (a build list) names none."""
    targets = set(AMD_ARCH.findall(msg))
    if len(targets) != 1:
        return None
    return targets.pop(), 2 if _AMD_DEVICE.search(msg) else 1


def capability_of(arch: str | None) -> str | None:
    if not arch or not arch.startswith("sm_"):
        return None
    digits = arch[3:]
    return f"{digits[:-1]}.{digits[-1]}"


# Statements about the device itself (strong) vs arch strings that may name a kernel's target (weak).
DEVICE_STATEMENTS = [
    lazy_compile(r"[Cc]urrent device has SM ?(?P<n>\d{2,3})"),
    lazy_compile(r"with CUDA capability (?P<tok>sm_\d{2,3})"),
    lazy_compile(r"(?:compute capability|CUDA capability|Compute Capability)[ :=]+(?P<cc>\d{1,2}\.\d)\b"),
    lazy_compile(r"capability \((?P<maj>\d{1,2}), (?P<min>\d)\)"),
    lazy_compile(r"(?:not runnable|no kernels runnable) on (?P<tok>sm\d{2,3})"),
    lazy_compile(r"\bgot SM ?(?P<n>\d{2,3})\b"),
    lazy_compile(r"(?:on|for) this GPU \((?P<tok>SM\d{2,3})\)"),
    lazy_compile(r"detected (?:GPU )?(?:arch(?:itecture)? )?(?P<tok>sm_\d{2,3})", re.I),
]
WEAK_ARCH = lazy_compile(
    r"\b(?:sm_?1[0-2]\d[af]?|sm_?[5-9]\d[af]?)\b|Sm1[0-2]\d[af]?Kernel|/1[0-2]\d[af]/", re.I
)


def arch_from_statement(msg: str) -> str | None:
    for pattern in DEVICE_STATEMENTS:
        m = pattern.search(msg)
        if not m:
            continue
        groups = m.groupdict()
        if groups.get("n"):
            n = groups["n"]
            return f"sm_{n}" if len(n) >= 2 else None
        if groups.get("tok"):
            return normalise_arch(groups["tok"])
        if groups.get("cc"):
            return arch_from_capability(groups["cc"])
        if groups.get("maj"):
            return f"sm_{groups['maj']}{groups['min']}"
    return None


ARCH_MARKS = ("sm", "SM", "Sm", "sM", "/1")  # what every weak hint holds


def weak_arch_hint(msg: str) -> str | None:
    # ARCH_MARKS tested one by one: a generator over them cost a traceback's every frame a microsecond
    if not ("sm" in msg or "SM" in msg or "Sm" in msg or "sM" in msg or "/1" in msg):
        return None
    m = WEAK_ARCH.search(msg)
    if not m:
        return None
    token = m.group(0)
    if token.startswith("/"):
        return f"sm_{token.strip('/')[:3]}"
    return normalise_arch(token)


# A JIT compile builds for the device it runs on: the target it names is the device's arch (an AOT build
# names a list of targets, and a cache directory of several archs, `75_80_89_90`, names none).
_JIT_TARGETS = [
    # Triton's ptxas call and its refusal: `--gpu-name=sm_120a`, `Value 'sm_121a' is not defined for option 'gpu-name'`
    lazy_compile(r"--gpu-name[= ](?P<tok>sm_\d{2,3}[afk]?)\b"),
    lazy_compile(r"Value '(?P<tok>sm_\d{2,3}[afk]?)' is not defined for option 'gpu-name'"),
    # FlashInfer's JIT workspace: ~/.cache/flashinfer/[<version>/]<archs>/{cached_ops,generated}
    lazy_compile(
        r"\.cache/flashinfer/(?:\d+\.\d+[\w.+-]*/)?(?:(?P<n>\d{2,3})[af]?|(?P<gfx>gfx[0-9a-f]{3,4}))/"
        r"(?:cached_ops|generated)\b"
    ),
    # DeepGEMM compiles its kernels for the device at run time
    lazy_compile(
        r"NVCC compilation failed: nvcc fatal\s*: Unsupported gpu architecture '(?P<tok>(?:sm|compute)_\d{2,3}[afk]?)'"
    ),
]
_GENCODE = lazy_compile(r"(?:-gencode[= ]|--generate-code[= ])arch=compute_(?P<n>\d{2,3})[afk]?\b")
# build lines of a JIT (FlashInfer, DeepGEMM, torch cpp_extension's ~/.cache/torch_extensions), not of a wheel
_JIT_BUILD = lazy_compile(r"cached_ops|\.cache/flashinfer|torch_extensions|deep_gemm|\bjit\b|JIT", re.I)


def jit_target_arch(msg: str) -> str | None:
    """The arch a JIT compile line builds for: the running device's, when the line names exactly one."""
    for pattern in _JIT_TARGETS:
        m = pattern.search(msg)
        if m:
            groups = m.groupdict()
            if groups.get("gfx"):
                return groups["gfx"]
            return f"sm_{groups['n']}" if groups.get("n") else normalise_arch(groups.get("tok") or "")
    targets = {m.group("n") for m in _GENCODE.finditer(msg)}
    if len(targets) == 1 and _JIT_BUILD.search(msg):
        return f"sm_{targets.pop()}"
    return None

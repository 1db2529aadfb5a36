"""The launch-flag catalogs (dispatchlab/core/data/flags-*.json) and their generator.

No network and no sglang import: the generator is exercised on small synthetic sources
written to a temporary directory, and the shipped catalog is checked against the genuine
ServerArgs dumps in tests/fixtures/genuine/.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "dispatchlab" / "core" / "data"
GENUINE = ROOT / "tests" / "fixtures" / "genuine"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_flag_catalog", ROOT / "tools" / "gen_flag_catalog.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_flag_catalog", mod)
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()


@pytest.fixture(scope="module")
def sglang_catalog() -> dict:
    return json.loads((DATA / "flags-sglang.json").read_text())


def _version_key(v: str) -> tuple:
    return gen._version_key(v)


# ---------------------------------------------------------------------------------------
# The shipped SGLang catalog
# ---------------------------------------------------------------------------------------


def test_catalog_header_and_versions(sglang_catalog):
    cat = sglang_catalog
    assert cat["server"] == "sglang"
    assert cat["generated_by"].startswith("python tools/gen_flag_catalog.py")
    versions = cat["version_order"]
    assert versions == sorted(cat["versions"], key=_version_key)
    assert len(versions) >= 3
    assert versions[0].startswith("0.4.")
    assert _version_key(versions[-1]) >= _version_key("0.5.23")
    for v in versions:
        assert len(cat["versions"][v]) > 100, v


def test_catalog_is_compact(sglang_catalog):
    assert (DATA / "flags-sglang.json").stat().st_size < 1_000_000


def test_moe_runner_backend_newest(sglang_catalog):
    newest = sglang_catalog["version_order"][-1]
    entry = sglang_catalog["versions"][newest]["--moe-runner-backend"]
    assert entry["dest"] == "moe_runner_backend"
    assert {"auto", "triton", "flashinfer_cutlass", "deep_gemm"} <= set(entry["choices"])
    assert entry["default"] == "auto"
    assert entry["type"] == "str"
    assert entry["action"] is None


def test_speculative_moe_runner_backend_is_new(sglang_catalog):
    order = sglang_catalog["version_order"]
    newest = sglang_catalog["versions"][order[-1]]
    oldest = sglang_catalog["versions"][order[0]]
    assert "--speculative-moe-runner-backend" in newest
    assert "--speculative-moe-runner-backend" not in oldest
    assert "triton" in newest["--speculative-moe-runner-backend"]["choices"]
    assert "--moe-runner-backend" not in oldest  # 0.4.x had no MoE runner selection


def test_attention_backend_choices_in_every_version(sglang_catalog):
    for v in sglang_catalog["version_order"]:
        entry = sglang_catalog["versions"][v]["--attention-backend"]
        assert {"fa3", "flashinfer", "triton"} <= set(entry["choices"]), v
        assert "choices_unresolved" not in entry


def test_quantization_and_kv_cache_dtype(sglang_catalog):
    newest = sglang_catalog["versions"][sglang_catalog["version_order"][-1]]
    assert {"fp8", "awq", "modelopt_fp4"} <= set(newest["--quantization"]["choices"])
    assert newest["--quantization"]["default"] is None
    assert "fp8_e4m3" in newest["--kv-cache-dtype"]["choices"]


def test_store_true_flags(sglang_catalog):
    for v in sglang_catalog["version_order"]:
        entry = sglang_catalog["versions"][v]["--trust-remote-code"]
        assert entry["action"] == "store_true"
        assert entry["default"] is False
        assert entry["type"] is None


def test_tensor_parallel_aliases(sglang_catalog):
    cat = sglang_catalog
    # up to 0.5.10 the flag was declared as ("--tensor-parallel-size", "--tp-size")
    old = cat["versions"]["0.5.10.post1"]["--tensor-parallel-size"]
    assert old["aliases"] == ["--tp-size"]
    assert old["default"] == 1
    assert cat["aliases"]["0.5.10.post1"]["--tp-size"] == "--tensor-parallel-size"
    # the declarative fields turned it around: --tp-size with alias --tensor-parallel-size
    new = cat["versions"]["0.5.23"]["--tp-size"]
    assert new["dest"] == "tp_size"
    assert new["aliases"] == ["--tensor-parallel-size"]


def test_no_unresolved_choices_in_shipped_versions(sglang_catalog):
    for v in sglang_catalog["version_order"]:
        bad = [f for f, e in sglang_catalog["versions"][v].items() if e.get("choices_unresolved")]
        assert bad == [], (v, bad)


def test_dynamic_choices_resolved_through_helpers(sglang_catalog):
    newest = sglang_catalog["versions"]["0.5.23"]
    # choices computed by zero-argument helper functions and enums in 0.5.23
    assert {"deepseek-r1", "qwen3"} <= set(newest["--reasoning-parser"]["choices"])
    assert newest["--reasoning-parser"]["choices"][0] == "auto"
    assert newest["--kv-canary-real-data"]["choices"] == ["none", "partial", "all"]
    assert newest["--cuda-graph-backend-decode"]["choices"] == ["full", "breakable", "disabled"]


def test_deprecated_flags_are_marked(sglang_catalog):
    newest = sglang_catalog["versions"]["0.5.23"]
    entry = newest["--disable-cuda-graph"]
    assert entry["deprecated"] is True
    assert "deprecated" in entry["deprecated_hint"].lower()


@pytest.mark.parametrize("tag", ["0523", "0510post1"])
def test_genuine_dump_values_are_valid_choices(sglang_catalog, tag):
    """Every value set in a genuine ServerArgs dump is a legal choice of its flag."""
    version = {"0523": "0.5.23", "0510post1": "0.5.10.post1"}[tag]
    flags = sglang_catalog["versions"][version]
    by_dest = {e["dest"]: e for e in flags.values()}
    checked = 0
    for path in sorted(GENUINE.glob(f"server_args_{tag}_*.expected.json")):
        for dest, value in json.loads(path.read_text()).items():
            entry = by_dest.get(dest)
            if entry is None or not entry["choices"] or value is None:
                continue
            assert value in entry["choices"], (path.name, dest, value)
            checked += 1
    assert checked >= 8


def test_defaults_match_genuine_unresolved_dump(sglang_catalog):
    """sglang 0.5.23 builds ServerArgs without resolving anything, so a fresh object holds
    exactly the declared defaults: the catalog's defaults must equal them."""
    fields = json.loads((GENUINE / "server_args_0523_default.fields.json").read_text())["jsonable"]
    flags = sglang_catalog["versions"]["0.5.23"]
    passed = {"model_path", "device", "skip_tokenizer_init"}
    compared = 0
    for flag, entry in flags.items():
        dest = entry["dest"]
        if dest in fields and dest not in passed:
            assert entry["default"] == fields[dest], (flag, entry["default"], fields[dest])
            compared += 1
    assert compared > 400


# ---------------------------------------------------------------------------------------
# The generator on synthetic sources
# ---------------------------------------------------------------------------------------

OLD_STYLE = """
import argparse
import dataclasses
from typing import List, Optional

from sglang.srt.choices import EXTRA_BACKENDS

BASE_BACKENDS = ["auto", "triton"]
MOE_RUNNER_BACKEND_CHOICES = BASE_BACKENDS + ["flashinfer_cutlass"] + EXTRA_BACKENDS
MOE_RUNNER_BACKEND_CHOICES.append("cutlass")
QUANT = {"fp8": 1, "awq": 2}
MODES = [m for m in ("a", "b", "c") if m != "b"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    moe_runner_backend: str = "auto"
    cuda_graph_bs: Optional[List[int]] = None
    quantization: Optional[str] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, required=True, help="Model.")
        parser.add_argument(
            "--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size
        )
        parser.add_argument(
            "--moe-runner-backend",
            type=str,
            choices=MOE_RUNNER_BACKEND_CHOICES,
            default=ServerArgs.moe_runner_backend,
        )
        parser.add_argument("--quantization", choices=list(QUANT.keys()), default=None)
        parser.add_argument("--mode", choices=MODES, default="a")
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+")
        parser.add_argument("--trust-remote-code", action="store_true")
        parser.add_argument("--mystery", choices=compute_at_runtime(), default=None)
        parser.add_argument(
            "--enable-old-thing", action="store_true", help="Deprecated: use --new-thing."
        )
"""

CHOICES_MODULE = """
EXTRA_BACKENDS = ["deep_gemm"]
"""

NEW_STYLE_FIELDS = """
from typing import List, Literal, Optional

import msgspec

from sglang.srt.arg_groups.arg_utils import A, Arg, Derived
from sglang.srt.choices import EXTRA_BACKENDS

SPEC_BACKENDS = ["triton"] + EXTRA_BACKENDS


class Exec(msgspec.Struct):
    _NS_PATH = "exec"

    tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
    speculative_moe_runner_backend: A[
        Optional[str], Arg(help="Spec MoE.", choices=SPEC_BACKENDS)
    ] = None
    deepep_mode: A[Literal["auto", "normal", "low_latency"], "DeepEP mode."] = "auto"
    enable_thing: A[bool, "Enable the thing."] = False
    cuda_graph_bs: A[Optional[List[int]], "Batch sizes."] = None
    internal_only: A[int, Arg(help="Hidden.", no_cli=True)] = 3
    rank: A[int, Derived(doc="set at runtime")] = 0
    renamed: A[str, Arg(help="x", cli_name="--other-name")] = "v"
"""

NEW_STYLE_SERVER_ARGS = """
import argparse

import msgspec

from sglang.srt.arg_groups.fields.exec_ import Exec


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument(
            "--disable-cuda-graph",
            action=DeprecatedStoreTrueAction,
            help="Deprecated. Use --cuda-graph-backend=disabled instead.",
        )


_INPUT_NAMESPACES = [Exec]
_annotations, _defaults, _ns = collect_input_fields(_INPUT_NAMESPACES)
"""


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))


def _make_old(root: Path, version: str) -> Path:
    pkg = root / f"old-{version}"
    _write(pkg, "sglang/__init__.py", "")
    _write(pkg, "sglang/version.py", f'__version__ = "{version}"\n')
    _write(pkg, "sglang/srt/__init__.py", "")
    _write(pkg, "sglang/srt/choices.py", CHOICES_MODULE)
    _write(pkg, "sglang/srt/server_args.py", OLD_STYLE)
    return pkg


def _make_new(root: Path, version: str) -> Path:
    pkg = root / f"new-{version}"
    _write(pkg, "sglang/__init__.py", "")
    _write(pkg, "sglang/version.py", f'__version__ = "{version}"\n')
    _write(pkg, "sglang/srt/__init__.py", "")
    _write(pkg, "sglang/srt/choices.py", CHOICES_MODULE)
    _write(pkg, "sglang/srt/arg_groups/__init__.py", "")
    _write(pkg, "sglang/srt/arg_groups/fields/__init__.py", "")
    _write(pkg, "sglang/srt/arg_groups/fields/exec_.py", NEW_STYLE_FIELDS)
    _write(pkg, "sglang/srt/server_args.py", NEW_STYLE_SERVER_ARGS)
    return pkg


def _run(tmp_path: Path, *sources: Path) -> dict:
    out = tmp_path / "out" / "flags.json"
    assert gen.main(["--out", str(out), *map(str, sources)]) == 0
    return json.loads(out.read_text())


def test_generator_explicit_add_argument(tmp_path):
    cat = _run(tmp_path, _make_old(tmp_path, "0.4.9"))
    assert cat["version_order"] == ["0.4.9"]
    flags = cat["versions"]["0.4.9"]
    assert flags["--moe-runner-backend"] == {
        "dest": "moe_runner_backend",
        "choices": ["auto", "triton", "flashinfer_cutlass", "deep_gemm", "cutlass"],
        "default": "auto",
        "type": "str",
        "action": None,
        "nargs": None,
        "aliases": [],
    }
    tp = flags["--tensor-parallel-size"]
    assert tp["dest"] == "tensor_parallel_size"
    assert tp["aliases"] == ["--tp-size"]
    assert tp["default"] == 1
    assert tp["type"] == "int"
    assert cat["aliases"]["0.4.9"] == {"--tp-size": "--tensor-parallel-size", "--model": "--model-path"}
    assert flags["--model-path"]["required"] is True
    assert flags["--quantization"]["choices"] == ["fp8", "awq"]
    assert flags["--mode"]["choices"] == ["a", "c"]
    assert flags["--cuda-graph-bs"]["nargs"] == "+"
    assert flags["--trust-remote-code"]["action"] == "store_true"
    assert flags["--trust-remote-code"]["default"] is False
    mystery = flags["--mystery"]
    assert mystery["choices"] is None and mystery["choices_unresolved"] is True
    assert flags["--enable-old-thing"]["deprecated"] is True
    assert "deprecated" not in flags["--moe-runner-backend"]


def test_generator_declarative_fields_and_wheels(tmp_path):
    new_dir = _make_new(tmp_path, "0.5.99")
    # also read the same tree packed as a wheel
    whl = tmp_path / "sglang-0.5.99.post1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for f in new_dir.rglob("*.py"):
            zf.write(f, f.relative_to(new_dir).as_posix())
    cat = _run(tmp_path, new_dir, whl, _make_old(tmp_path, "0.4.9"))
    assert cat["version_order"] == ["0.4.9", "0.5.99", "0.5.99.post1"]
    assert cat["versions"]["0.5.99"] == cat["versions"]["0.5.99.post1"]
    flags = cat["versions"]["0.5.99"]
    assert flags["--speculative-moe-runner-backend"]["choices"] == ["triton", "deep_gemm"]
    assert flags["--speculative-moe-runner-backend"]["default"] is None
    assert flags["--tp-size"]["aliases"] == ["--tensor-parallel-size"]
    assert flags["--tp-size"]["dest"] == "tp_size"
    assert flags["--deepep-mode"]["choices"] == ["auto", "normal", "low_latency"]
    assert flags["--deepep-mode"]["type"] == "str"
    assert flags["--enable-thing"]["action"] == "store_true"
    assert flags["--cuda-graph-bs"]["nargs"] == "+"
    assert flags["--cuda-graph-bs"]["type"] == "int"
    assert flags["--other-name"]["dest"] == "renamed"
    assert "--internal-only" not in flags
    assert "--rank" not in flags
    dep = flags["--disable-cuda-graph"]
    assert dep["deprecated"] is True
    assert dep["action"] == "DeprecatedStoreTrueAction"
    assert "--speculative-moe-runner-backend" not in cat["versions"]["0.4.9"]


@pytest.fixture(scope="module")
def vllm_catalog() -> dict:
    return json.loads((DATA / "flags-vllm.json").read_text())


def test_vllm_catalog_versions(vllm_catalog):
    assert vllm_catalog["server"] == "vllm"
    assert vllm_catalog["generated_by"].startswith("python tools/gen_flag_catalog.py --server vllm")
    assert len(vllm_catalog["version_order"]) >= 3
    assert (DATA / "flags-vllm.json").stat().st_size < 1_000_000


def test_vllm_known_flags(vllm_catalog):
    order = vllm_catalog["version_order"]
    newest = vllm_catalog["versions"][order[-1]]
    tp = newest["--tensor-parallel-size"]
    assert tp["aliases"] == ["-tp"] and tp["default"] == 1 and tp["type"] == "int"
    # enforced argparse choices (a plain Literal, sorted as vLLM's get_kwargs sorts them)
    moe = newest["--moe-backend"]
    assert {"auto", "triton", "flashinfer_cutlass", "deep_gemm"} <= set(moe["choices"])
    assert moe["choices"] == sorted(moe["choices"])
    assert "choices_open" not in moe
    assert "--moe-backend" not in vllm_catalog["versions"][order[0]]
    # `X | str` and enum-typed fields: known values, but argparse takes any string
    for flag, value in (
        ("--quantization", "fp8"),
        ("--kv-cache-dtype", "fp8_e4m3"),
        ("--attention-backend", "FLASH_ATTN"),
    ):
        entry = newest[flag]
        assert value in entry["choices"], flag
        assert entry["choices_open"] is True, flag
    assert newest["--attention-backend"]["choices_from_enum"] == "AttentionBackendEnum"
    # vLLM's parser pairs --enable-X with --disable-X
    assert newest["--enable-prefix-caching"]["aliases"] == ["--disable-prefix-caching"]
    assert newest["--port"]["default"] == 8000


VLLM_CONFIG = """
from dataclasses import field
from typing import TYPE_CHECKING, Literal

MoeBackend = Literal["auto", "triton", "cutlass"]
if TYPE_CHECKING:
    from vllm.quant import QuantizationMethods
else:
    QuantizationMethods = str


class KernelConfig:
    moe_backend: MoeBackend = "auto"
    quantization: QuantizationMethods | str | None = None
    enable_thing: bool = False
    tensor_parallel_size: int = field(default=1)
"""

VLLM_QUANT = """
from typing import Literal

QuantizationMethods = Literal["fp8", "awq"]
"""

VLLM_ARG_UTILS = """
from vllm.config.kernel import KernelConfig


class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        kernel_kwargs = get_kwargs(KernelConfig)
        group = parser.add_argument_group("Kernel")
        group.add_argument("--moe-backend", **kernel_kwargs["moe_backend"])
        group.add_argument("--quantization", "-q", **kernel_kwargs["quantization"])
        group.add_argument("--enable-thing", **kernel_kwargs["enable_thing"])
        group.add_argument(
            "--tensor-parallel-size", "-tp", **{**kernel_kwargs["tensor_parallel_size"], "default": 2}
        )
        parser.add_argument("--disable-log-stats", action="store_true")
        return parser
"""


def test_generator_vllm_style(tmp_path):
    pkg = tmp_path / "vllm-tree"
    _write(pkg, "vllm/__init__.py", "")
    _write(pkg, "vllm/version.py", '__version__ = "0.99.0"\n')
    _write(pkg, "vllm/config/__init__.py", "")
    _write(pkg, "vllm/config/kernel.py", VLLM_CONFIG)
    _write(pkg, "vllm/quant.py", VLLM_QUANT)
    _write(pkg, "vllm/engine/__init__.py", "")
    _write(pkg, "vllm/engine/arg_utils.py", VLLM_ARG_UTILS)
    out = tmp_path / "flags-vllm.json"
    assert gen.main(["--server", "vllm", "--out", str(out), str(pkg)]) == 0
    flags = json.loads(out.read_text())["versions"]["0.99.0"]
    assert flags["--moe-backend"]["choices"] == ["auto", "cutlass", "triton"]
    assert flags["--moe-backend"]["default"] == "auto"
    assert flags["--moe-backend"]["from_config"] == "KernelConfig.moe_backend"
    q = flags["--quantization"]
    assert q["choices"] == ["fp8", "awq"] and q["choices_open"] is True
    assert q["aliases"] == ["-q"]
    assert flags["--enable-thing"]["action"] == "argparse.BooleanOptionalAction"
    assert flags["--enable-thing"]["aliases"] == ["--no-enable-thing"]
    tp = flags["--tensor-parallel-size"]
    assert tp["default"] == 2 and tp["type"] == "int" and tp["aliases"] == ["-tp"]
    assert flags["--disable-log-stats"]["action"] == "store_true"

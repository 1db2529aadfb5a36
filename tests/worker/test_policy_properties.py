"""Properties of the GPU host's policy over the flag catalogs: hostile launches generated from every
catalogued release of SGLang and vLLM are refused, ordinary ones pass, and every flag is classified."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchlab.core.flags import catalog
from dispatchlab.core.launch import LaunchError, launch_from_spec
from worker.config import DEFAULT_ENV_ALLOW, WorkerConfig
from worker.flag_kinds import COMMON, REVIEWED, FlagKind, classify
from worker.policy import FlagSpec, Refused, approve, catalog_specs, flag_use_problems, repro_specs
from worker.repro import REPRO_PROGRAMS, repro_parser

ROOT = (Path(__file__).parent / "policy-models").resolve()  # never created: paths are only compared
MODEL = str(ROOT / "qwen")
CONFIG = WorkerConfig(
    host="h200-test",
    launchers={"repro:moe-serve": ["python", "-m", "worker.repro", "moe-serve"]},
    model_roots=(ROOT,),
)
LAUNCHER = {"sglang": "sglang", "vllm": "vllm"}
RELEASES = [(server, version) for server in ("sglang", "vllm") for version in catalog(server)]
QUICK = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def specs_of(server: str, version: str, *kinds: FlagKind) -> list[FlagSpec]:
    return [s for s in catalog_specs(server, version) if s.kind in kinds]


def problems(server: str, version: str, args: list[str]) -> list[str]:
    try:
        launch = launch_from_spec({"launcher": LAUNCHER[server], "args": args, "env": {}})
    except LaunchError as error:  # approve() refuses with this message too
        return [str(error)]
    return flag_use_problems(launch, CONFIG, version=version)[1]


def model_args(server: str) -> list[str]:
    return [MODEL] if server == "vllm" else ["--model-path", MODEL]


WORD = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)


def values_for(spec: FlagSpec) -> st.SearchStrategy[list[str]]:
    if spec.choices:
        one: st.SearchStrategy[str] = st.sampled_from(spec.choices)
    elif spec.number is int:
        one = st.integers(0, 4096).map(str)
    elif spec.number is float:
        one = st.floats(0, 1, allow_nan=False).map(lambda x: f"{x:.3f}")
    else:
        one = WORD
    if spec.nargs == 0:
        return st.just([])
    if spec.nargs in (None, 1):
        return st.lists(one, min_size=1, max_size=1)
    if isinstance(spec.nargs, int):
        return st.lists(one, min_size=spec.nargs, max_size=spec.nargs)
    low, high = {"?": (0, 1), "*": (0, 3), "+": (1, 3)}[str(spec.nargs)]
    return st.lists(one, min_size=low, max_size=high)


def abbreviations(server: str, version: str, spec: FlagSpec) -> list[str]:
    """The prefixes of the flag's long names that argparse expands to it and to nothing else."""
    names = {n for s in catalog_specs(server, version) for n in s.names}
    found = []
    for name in (n for n in spec.names if n.startswith("--")):
        for cut in range(3, len(name)):
            prefix = name[:cut]
            if prefix not in names and [n for n in names if n.startswith(prefix)] == [name]:
                found.append(prefix)
                break
    return found


@st.composite
def hostile_flag(draw: st.DrawFn, kinds: tuple[FlagKind, ...]) -> tuple[str, str, list[str], FlagSpec]:
    server, version = draw(st.sampled_from(RELEASES))
    spec = draw(st.sampled_from(specs_of(server, version, *kinds)))
    spelling = draw(st.sampled_from([*spec.names, *abbreviations(server, version, spec)]))
    values = ["/etc/passwd"] if spec.nargs not in (0, "?", "*") else []
    if values and draw(st.booleans()):
        return server, version, [*model_args(server), f"{spelling}={values[0]}"], spec
    return server, version, [*model_args(server), spelling, *values], spec


def test_every_flag_of_every_catalogued_release_is_classified():
    unclassified = [
        f"{server} {version} {flag}"
        for server, version in RELEASES
        for flag, entry in catalog(server)[version].items()
        if classify(server, flag, entry) is None
    ]
    assert unclassified == []


def test_every_reviewed_flag_names_a_flag_some_release_has():
    for server in ("sglang", "vllm"):
        known = {flag for release in catalog(server).values() for flag in release}
        assert sorted(set(REVIEWED[server]) - known) == []
    assert set(COMMON) <= {flag for s in ("sglang", "vllm") for r in catalog(s).values() for flag in r}


@QUICK
@given(hostile_flag((FlagKind.CODE, FlagKind.HOST)))
def test_a_flag_that_loads_code_or_belongs_to_the_host_is_refused_in_every_spelling(case):
    server, version, args, spec = case
    found = problems(server, version, args)
    assert any(spec.flag in p and "refused unless this host lists" in p for p in found), found


@QUICK
@given(hostile_flag((FlagKind.MODEL, FlagKind.PATH, FlagKind.NAMED_MODEL)), st.sampled_from([
    "/etc/passwd", str(ROOT / ".." / "elsewhere"), "org/evil-model", "relative/dir", "~/models",
]))  # fmt: skip
def test_a_model_or_file_outside_the_roots_is_refused_in_every_spelling(case, outside):
    server, version, args, spec = case
    args = [outside if a == "/etc/passwd" else a.replace("=/etc/passwd", f"={outside}") for a in args]
    if spec.nargs in (0, "?", "*"):
        args.append(outside)
    found = problems(server, version, args)
    assert any(outside in p for p in found), found


@QUICK
@given(st.data())
def test_a_word_after_a_vllm_flags_values_is_read_as_the_model_and_refused(data):
    version = data.draw(st.sampled_from(list(catalog("vllm"))))
    spec = data.draw(st.sampled_from([s for s in specs_of("vllm", version, FlagKind.VALUE, FlagKind.SWITCH)
                                      if s.nargs in (None, 0, 1)]))  # fmt: skip
    values = data.draw(values_for(spec))
    spelling = data.draw(st.sampled_from(spec.names))
    found = problems("vllm", version, [spelling, *values, "attacker/evil-model"])
    assert any("'attacker/evil-model'" in p for p in found), found


@st.composite
def ordinary_launch(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    server, version = draw(st.sampled_from(RELEASES))
    plain = specs_of(server, version, FlagKind.SWITCH, FlagKind.VALUE)
    chosen = draw(st.lists(st.sampled_from(plain), max_size=6, unique_by=lambda s: s.flag))
    args = model_args(server)
    for spec in chosen:
        args += [spec.names[0], *draw(values_for(spec))]
    return server, version, args


@QUICK
@given(ordinary_launch())
def test_a_launch_of_switches_and_plain_values_with_a_model_under_the_roots_passes(case):
    server, version, args = case
    assert problems(server, version, args) == []


DANGEROUS_NAME = st.one_of(
    st.builds("LD_{}".format, st.sampled_from(["PRELOAD", "LIBRARY_PATH", "AUDIT"])),
    st.builds("{}_{}".format, st.sampled_from(["NCCL", "TORCH", "TRITON", "SGLANG", "VLLM", "HF"]),
              st.sampled_from(["PATH", "DIR", "FILE", "PLUGIN", "HOME", "URL", "CACHE_DIR", "LIB"])),
    st.sampled_from(["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_DEBUG_FILE", "TRITON_PTXAS_PATH",
                     "TORCH_EXTENSIONS_DIR", "PYTHONPATH", "PYTHONSTARTUP", "CUDA_VISIBLE_DEVICES"]),
)  # fmt: skip


@QUICK
@given(DANGEROUS_NAME)
def test_an_environment_name_that_loads_code_files_or_the_network_is_refused_even_when_listed(name):
    listed = WorkerConfig(
        host=CONFIG.host,
        launchers=CONFIG.launchers,
        model_roots=CONFIG.model_roots,
        env_allow=(*DEFAULT_ENV_ALLOW, name),
    )
    with pytest.raises(Refused, match=name):
        approve({"launcher": "repro:moe-serve", "args": ["--model-path", MODEL], "env": {name: "x"}}, listed)


def test_no_default_environment_name_is_a_pattern():
    assert all("*" not in name for name in DEFAULT_ENV_ALLOW)


def test_every_flag_of_every_repro_program_is_classified():
    unclassified = [
        f"{name} {spec.flag}"
        for name in REPRO_PROGRAMS
        for spec in repro_specs(repro_parser(name))  # type: ignore[arg-type]
        if spec.kind is None
    ]
    assert unclassified == []

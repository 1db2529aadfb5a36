"""The three small vocabularies the facts rest on: PEP 440 versions, GPU architectures, the flag catalog."""

from __future__ import annotations

import pytest

from dispatchlab.core import arch, flags
from dispatchlab.core.versions import InvalidSpecifier, SpecifierSet, Version


@pytest.mark.parametrize(
    ("spec", "version", "inside"),
    [
        ("<0.6", "0.6.0rc1", False),  # PEP 440: a pre-release of 0.6 is not below 0.6
        ("<0.6", "0.5.9", True),
        (">0.5.6", "0.5.6.post1", False),  # ... and a post-release of 0.5.6 is not above 0.5.6
        (">0.5.6", "0.5.7", True),
        (">=0.5.5,<0.6", "0.5.10rc1", True),  # a release candidate is what people run
        (">=2.8", "2.8.0+cu128", True),  # local versions of torch builds
        ("~=0.4.1", "0.4.9", True),
        ("~=0.4.1", "0.5.0", False),
        ("==0.5.*", "0.5.10.post1", True),
        ("!=0.5.*", "0.5.3", False),
    ],
)
def test_a_version_condition_follows_pep_440(spec: str, version: str, inside: bool):
    assert SpecifierSet(spec).contains(version) is inside


def test_a_version_the_log_garbled_is_an_unknown_fact_not_a_mismatch():
    assert SpecifierSet(">=0.5").contains("module not found") is None


@pytest.mark.parametrize("spec", ["", "0.5", ">>0.5", ">=banana", "~=1"])
def test_a_malformed_specifier_is_refused(spec: str):
    with pytest.raises(InvalidSpecifier):
        SpecifierSet(spec)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm_120"),
        ("NVIDIA GeForce RTX 5090", "sm_120"),
        ("NVIDIA GB10", "sm_121"),
        ("NVIDIA B200", "sm_100"),
        ("NVIDIA GB300", "sm_103"),
        ("NVIDIA H200", "sm_90"),
        ("NVIDIA H100 80GB HBM3", "sm_90"),
        ("NVIDIA L40S", "sm_89"),
        ("NVIDIA A100-SXM4-80GB", "sm_80"),
        ("NVIDIA_A10G", "sm_86"),
        ("AMD Instinct MI300X", "gfx942"),
        ("Tesla T4", "sm_75"),
        ("a toaster", None),
    ],
)
def test_a_gpu_name_gives_its_arch(name: str, expected: str | None):
    assert arch.arch_from_gpu_name(name) == expected


def test_compute_capability_and_arch_strings_agree_both_ways():
    assert arch.arch_from_capability("12.0") == "sm_120"
    assert arch.arch_from_capability("9.0") == "sm_90"
    assert arch.arch_from_capability("9.0", rocm=True) is None  # gfx90a reports 9.0: never Hopper
    assert arch.capability_of("sm_120") == "12.0"
    assert arch.capability_of("gfx942") is None
    for token, expected in [
        ("sm_120a", "sm_120"),
        ("SM100", "sm_100"),
        ("compute_90", "sm_90"),
        ("sm100f", "sm_100"),
    ]:
        assert arch.normalise_arch(token) == expected
    assert arch.normalise_arch("small") is None


def test_the_flag_catalog_takes_the_newest_release_not_newer_than_the_logs():
    versions = sorted(flags.catalog("sglang"))
    assert versions, "the shipped SGLang catalog is empty"
    newest = flags.release_for("sglang", None)
    assert newest == flags.release_for("sglang", "99.0")
    oldest_known = min(versions, key=Version)
    assert flags.release_for("sglang", "0.0.1") == flags.catalog("sglang")[oldest_known]
    assert flags.release_for("sglang", "0.5.10.post1") == flags.catalog("sglang")["0.5.10.post1"]


def test_defaults_tell_an_explicit_setting_from_the_default():
    defaults = flags.defaults_by_field("sglang", "0.5.10.post1")
    assert defaults["attention_backend"] is None  # chosen at run time unless set
    assert "moe_runner_backend" in defaults
    assert flags.defaults_by_field("tensorrt_llm", None) == {}


def test_a_releases_defaults_read_back_from_the_cache_are_the_catalogs(tmp_path, monkeypatch):
    monkeypatch.setenv("DISPATCHLAB_CACHE_DIR", str(tmp_path))
    flags.defaults_by_field.cache_clear()
    fresh = flags.defaults_by_field("sglang", "0.5.10.post1")
    assert list(tmp_path.glob("defaults-*.marshal")), "the defaults were not kept"
    flags.defaults_by_field.cache_clear()
    assert flags.defaults_by_field("sglang", "0.5.10.post1") == fresh
    release = flags.release_for("sglang", "0.5.10.post1")
    assert fresh == {spec["dest"]: spec.get("default") for spec in release.values() if spec.get("dest")}
    flags.defaults_by_field.cache_clear()

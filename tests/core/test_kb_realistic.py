"""The knowledge base on realistic logs written for it (tests/fixtures/kb): no false alarms on healthy or noisy
runs, the right class on failures whatever the release's wording or the log's prefixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchlab.core import analyze_paths
from dispatchlab.core.signatures import FAILURE_CLASSES

KB_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "kb"
CLEAN = sorted((KB_LOGS / "clean").glob("*.log"))
FAILING = sorted((KB_LOGS / "failing").glob("*.log"))

# The matcher counts a container's `exited with code 137` after an operator's stop as a fatal error
# (outcome "ready", no crash, yet the class is inferred as "other" and the SIGKILL warning fills it in).
KNOWN_PARSER_GAPS: dict[str, str] = {}

# The signature that must explain the failure (the best failure-level match), where one is expected.
EXPECTED_SIGNATURE = {
    "arch_unsupported_kernel__sglang_fa3_on_blackwell": "fa3-backend-on-non-hopper",
    "arch_unsupported_kernel__sglang_trtllm_mha_decode_rtx_pro_6000": "trtllm-gen-fmha-unsupported-arch",
    "arch_unsupported_kernel__sglang_trtllm_moe_on_h200": "trtllm-gen-moe-on-hopper",
    "arch_unsupported_kernel__triton_out_of_resources_shared_memory": "triton-shared-memory-out-of-resources",
    "compile_error__sglang_triton_compilation_error_moe": "triton-compilation-error",
    "compile_error__vllm_inductor_backend_compiler_failed": "torch-compile-backend-failure",
    "config_error__sglang_invalid_choice_attention_backend": "cli-invalid-argument",
    "config_error__vllm_invalid_int_value_kubectl": "cli-invalid-argument",
    "cuda_error__sglang_illegal_memory_access_decode": "cuda-illegal-memory-access",
    "cuda_error__vllm_worker_illegal_memory_flashinfer": "cuda-illegal-memory-access",
    "dependency_error__sglang_libcudart_missing_docker": "shared-library-not-found",
    "dependency_error__vllm_flash_attn_undefined_symbol_worker": "undefined-symbol-abi-mismatch",
    "dependency_error__vllm_module_not_found_ray_actor": "python-module-not-found",
    "nccl_error__docker_multinode_unhandled_system_error": "nccl-unhandled-system-error",
    "nccl_error__torchrun_unhandled_cuda_error_rank_prefix": "nccl-unhandled-cuda-error",
    "nccl_error__torchrun_watchdog_heartbeat": "nccl-watchdog-collective-timeout",
    "nccl_error__vllm_ray_remote_process_exited": "nccl-remote-or-internal-error",
    "oom__sglang_kv_pool_not_enough_memory_old": "sglang-kv-cache-no-room",
    "oom__sglang_weight_load_kubectl": "cuda-out-of-memory",
    "oom__vllm_cuda_graph_capture_worker_tp": "vllm-cuda-graph-capture-oom",
    "oom__vllm_kv_cache_below_max_model_len": "vllm-kv-cache-too-small-for-max-model-len",
    "oom__vllm_serving_engine_dead_old_torch": "cuda-out-of-memory",
    "weight_loading_error__sglang_param_shape_assert_ranks": "weight-shape-mismatch",
    "weight_loading_error__vllm_tried_to_load_weights_size": "weight-shape-mismatch",
}


def _clean_params():
    for log in CLEAN:
        marks = []
        if log.stem in KNOWN_PARSER_GAPS:
            marks.append(pytest.mark.xfail(reason=KNOWN_PARSER_GAPS[log.stem], strict=False))
        yield pytest.param(log, id=log.stem, marks=marks)


def test_the_realistic_fixture_sets_are_big_enough():
    assert len(CLEAN) >= 8
    assert len(FAILING) >= 12


@pytest.mark.parametrize("log", list(_clean_params()))
def test_a_healthy_or_noisy_log_is_not_reported_as_a_failure(log):
    doc = analyze_paths([log])
    failures = [m["id"] for m in doc["matches"] if m["level"] == "failure"]
    assert failures == [], f"{log.name}: failure-level matches {failures}"
    assert doc["failure_class"] == "none", f"{log.name}: {doc['failure_class']}"


@pytest.mark.parametrize("log", FAILING, ids=[p.stem for p in FAILING])
def test_a_failing_log_gets_the_class_its_name_gives(log):
    expected = log.stem.split("__", 1)[0]
    doc = analyze_paths([log])
    assert doc["failure_class"] == expected, (
        f"{log.name}: got {doc['failure_class']}; matches {[(m['id'], m['level']) for m in doc['matches']]}"
    )


@pytest.mark.parametrize("stem", sorted(EXPECTED_SIGNATURE))
def test_a_failing_log_is_explained_by_its_specific_signature(stem):
    doc = analyze_paths([KB_LOGS / "failing" / f"{stem}.log"])
    failures = [m["id"] for m in doc["matches"] if m["level"] == "failure"]
    assert failures and failures[0] == EXPECTED_SIGNATURE[stem], f"{stem}: {failures}"


def test_every_failing_fixture_names_a_class_of_the_taxonomy():
    classes = set(FAILURE_CLASSES) - {"none"}
    assert {p.stem.split("__", 1)[0] for p in FAILING} <= classes

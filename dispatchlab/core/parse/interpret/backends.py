"""The backends each model resolved: the args dump, refined by what the server announced, and the draft's."""

from __future__ import annotations

from typing import Any

from dispatchlab.core.flags import defaults_by_field
from dispatchlab.core.parse.model import Origin
from dispatchlab.core.parse.observations import Observations
from dispatchlab.core.serverargs import canonical_sglang_flag

# Contract keys of `backends`, with the server-args fields they come from.
SGLANG_BACKEND_FIELDS = {
    "attention_backend": "attention_backend",
    "prefill_attention_backend": "prefill_attention_backend",
    "decode_attention_backend": "decode_attention_backend",
    "moe_runner_backend": "moe_runner_backend",
    "moe_a2a_backend": "moe_a2a_backend",
    "fp4_gemm_backend": "fp4_gemm_runner_backend",
    "fp8_gemm_backend": "fp8_gemm_runner_backend",
    "sampling_backend": "sampling_backend",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "grammar_backend": "grammar_backend",
    "mm_attention_backend": "mm_attention_backend",
    "dsa_prefill_backend": "dsa_prefill_backend",
    "dsa_decode_backend": "dsa_decode_backend",
    "nsa_prefill_backend": "nsa_prefill_backend",
    "nsa_decode_backend": "nsa_decode_backend",
}
VLLM_BACKEND_FIELDS = {
    "attention_backend": "attention_backend",
    "moe_runner_backend": "moe_backend",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
}
_UNRESOLVED = ("auto", "None", "")


def _flags_given(obs: Observations, server: str) -> set[str]:
    return {canonical_sglang_flag(k) if server == "sglang" else k for k in obs.launch_args}


def _from_args(
    obs: Observations, server: str, version: str | None, args: dict[str, Any]
) -> dict[str, Origin]:
    given = _flags_given(obs, server)
    fields = SGLANG_BACKEND_FIELDS if server != "vllm" else VLLM_BACKEND_FIELDS
    origins: dict[str, Origin] = {}
    for key, field_name in fields.items():
        value = args.get(field_name)
        if value is None or isinstance(value, (dict, list)):
            continue
        source = "flag" if field_name in given else "args"
        defaults = defaults_by_field(server, version) if server in ("sglang", "vllm") else {}
        if source == "args" and field_name in defaults and defaults[field_name] == value:
            source = "default"  # the catalog of this release says nobody had to set it
        origins[key] = Origin(str(value), source, obs.dump_line, None)
    return origins


def _refine(obs: Observations, main: dict[str, Origin], draft: dict[str, Origin]) -> None:
    """A concrete announcement refines `auto`/None or confirms the dump; a weak one only fills a gap."""
    for announced in obs.announcements:
        key, weak = announced.key, announced.weak
        target = main if announced.model == "main" else draft
        current = target.get(key)
        if current is not None and weak and current.value not in _UNRESOLVED:
            continue
        if current is None or current.value in _UNRESOLVED or (not weak and current.source != "flag"):
            target[key] = announced.origin


def _draft(
    obs: Observations, args: dict[str, Any], main: dict[str, Origin], draft: dict[str, Origin]
) -> None:
    given = {canonical_sglang_flag(k) for k in obs.launch_args}

    def from_arg(key: str, field_name: str) -> None:
        value = args.get(field_name)
        if key not in draft and value is not None and not isinstance(value, (dict, list)):
            source = "flag" if field_name in given else "args"
            draft[key] = Origin(str(value), source, obs.dump_line, field_name)

    def inherit(key: str, why: str) -> None:
        if key not in draft and key in main:
            draft[key] = Origin(main[key].value, "inherited", main[key].line, why)

    from_arg("moe_runner_backend", "speculative_moe_runner_backend")
    inherit("moe_runner_backend", "speculative_moe_runner_backend not set: inherits the main model's")
    from_arg("moe_a2a_backend", "speculative_moe_a2a_backend")
    inherit("moe_a2a_backend", "speculative_moe_a2a_backend not set: inherits the main model's")
    from_arg("attention_backend", "speculative_draft_attention_backend")
    mode = args.get("speculative_attention_mode")
    phase_key = "decode_attention_backend" if mode == "decode" else "prefill_attention_backend"
    if "attention_backend" not in draft and phase_key in main:
        origin = main[phase_key]
        draft["attention_backend"] = Origin(
            origin.value, "inherited", origin.line, f"speculative_attention_mode={mode}"
        )
    inherit("attention_backend", "no draft attention backend set: uses the main model's")
    from_arg("quantization", "speculative_draft_model_quantization")
    for key in list(main):
        if key != "quantization" and not key.startswith(("prefill_", "decode_")):
            inherit(key, "shared with the main model")
    if args.get("speculative_algorithm"):
        draft.setdefault(
            "speculative_algorithm", Origin(str(args["speculative_algorithm"]), "args", obs.dump_line, None)
        )


def resolve_backends(
    obs: Observations, server: str, version: str | None, args: dict[str, Any]
) -> tuple[dict[str, Origin], dict[str, Origin]]:
    """(main, draft) origins of every backend key."""
    main = _from_args(obs, server, version, args)
    draft: dict[str, Origin] = {}
    _refine(obs, main, draft)
    if args.get("speculative_algorithm") or draft:
        _draft(obs, args, main, draft)
    return main, draft

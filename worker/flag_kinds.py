"""What every launch flag takes, reviewed by hand: the policy allows a flag by its kind, never by its
name alone. Switches, numbers and closed choices are classified from the catalog entry; every flag
that takes free text is listed here (tests/worker/test_flag_kinds.py fails on one that is not), and a
flag nobody classified is refused."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any


class FlagKind(StrEnum):
    SWITCH = "switch"  # takes no value
    VALUE = "value"  # a number, a choice or text the server loads nothing from
    MODEL = "model"  # a model, tokenizer or adapter folder: must resolve under the model roots
    NAMED_MODEL = "named model"  # NAME=PATH (LoRA adapters): the path must resolve under the model roots
    PATH = "path"  # a file or folder the server reads: must resolve under the model roots
    CODE = "code"  # loads code, or a config/template that can: refused unless the host allows the flag
    HOST = "host"  # the host's own: addresses, ports, GPUs, files it writes: refused unless allowed
    OWNED = "owned"  # set by the worker itself (--host, --port)


# Why a kind is refused, for the refusal message.
REFUSED_BECAUSE = {
    FlagKind.CODE: "loads code or a file that can name code",
    FlagKind.HOST: "belongs to the host (addresses, ports, GPU selection, files the server writes)",
}

_SWITCH_ACTIONS = re.compile(r"store_true|store_false|store_const|BooleanOptional|StoreTrue|StoreConst")
_NUMBER_TYPES = {"int": int, "float": float, "human_readable_int": int}
_HOST_NUMBER = re.compile(r"-ports?$|^--base-gpu-id$|^--gpu-id-step$")

# Flags every launcher shares.
COMMON: dict[str, FlagKind] = {
    "--host": FlagKind.OWNED,
    "--port": FlagKind.OWNED,
    "--trust-remote-code": FlagKind.CODE,
    "--trust-request-chat-template": FlagKind.CODE,
    "--trust-request-mm-kwargs": FlagKind.CODE,
}


def _kinds(**groups: str) -> dict[str, FlagKind]:
    table: dict[str, FlagKind] = {}
    for kind, names in groups.items():
        for name in names.split():
            table[name] = FlagKind[kind.upper()]
    return table


SGLANG = _kinds(
    value="""--admin-api-key --allowed-media-domains --api-key --collect-tokens-histogram
    --constrained-json-whitespace-pattern --cuda-graph-config --default-chat-template-kwargs --device
    --disable-cuda-graph --dllm-algorithm --ds-heavy-channel-type --enable-deepep-moe
    --enable-dp-attention --enable-dsa-prefill-context-parallel --enable-ep-moe
    --enable-flashinfer-cutedsl-moe --enable-flashinfer-cutlass-moe --enable-flashinfer-mla
    --enable-flashinfer-mxfp4-moe --enable-flashinfer-trtllm-moe --enable-flashmla
    --enable-nsa-prefill-context-parallel --enable-piecewise-cuda-graph --enable-prefill-context-parallel
    --enable-triton-kernel-moe --ep-dispatch-algorithm --eplb-algorithm --expert-distribution-recorder-mode
    --extra-metric-labels --fastapi-root-path --flashinfer-autotune-skip-ops --forward-pass-metrics-worker-id
    --generation-tokens-buckets --hf-chat-template-name --hybrid-kvcache-ratio --kt-method
    --limit-mm-data-per-request --log-level --log-level-http --lora-backend --mamba-scheduler-strategy
    --model-checksum --model-impl --modelopt-quant --offload-mode --otlp-service-name
    --piecewise-cuda-graph-tokens --preferred-sampling-params --prefill-round-robin-balance
    --prompt-tokens-buckets --radix-cache-backend --revision --served-model-name --speculative-algorithm
    --speculative-draft-attention-backend --speculative-draft-model-revision --ssl-keyfile-password
    --stream-output --tokenizer-metrics-allowed-custom-labels --tokenizer-metrics-custom-labels-header
    --torchao-config --uvicorn-access-log-exclude-prefixes --warmups --weight-version
    --debug-tensor-dump-inject""",
    model="--model-path --tokenizer-path --speculative-draft-model-path --uno-lora-path --kt-weight-path",
    named_model="--lora-paths",
    path="""--quantization-param-path --speculative-token-map --speculative-ngram-external-corpus-path
    --speculative-dspark-confidence-sts-path --speculative-dspark-sps-table-path --ds-channel-config-path
    --debug-tensor-dump-input-file --modelopt-checkpoint-restore-path""",
    code="""--chat-template --completion-template --config --custom-sigquit-handler --custom-weight-loader
    --decrypted-config-file --decrypted-draft-config-file --deepep-config --dllm-algorithm-config
    --flexkv-config-file --forward-hooks --hicache-storage-backend-extra-config --hisparse-config
    --init-expert-location --json-model-override-args --kv-events-config --lmcache-config-file
    --mm-process-config --model-config-parser --model-loader-extra-config --modelexpress-config
    --msprobe-dump-config --pdmux-config-path --radix-eviction-policy-config --rl-quant-profile --sidecar
    --sidecar-args --speculative-adaptive-config --trace-modules --unified-cache-external-linker-config
    --watermark-config --enable-custom-logit-processor""",
    host="""--crash-dump-folder --debug-tensor-dump-output-folder --decoupled-spec-bind-endpoint
    --decoupled-spec-connect-endpoints --disaggregation-ib-device --dist-init-addr --download-dir
    --encoder-register-urls --encoder-urls --export-metrics-to-file-dir --file-storage-path
    --forward-pass-metrics-ipc-name --load-publish-endpoint --log-requests-target --modelopt-checkpoint-save-path
    --modelopt-export-path --mooncake-ib-device --oltp-traces-endpoint --otlp-traces-endpoint --pdlb-url
    --ple-offload-dir --remote-instance-weight-loader-seed-instance-ip
    --remote-instance-weight-loader-send-weights-group-ports --spec-trace-dir --ssl-ca-certs --ssl-certfile
    --ssl-keyfile --tool-server --weight-cache-socket --enable-nccl-nvls --delete-ckpt-after-loading
    --export-metrics-to-file""",
)

VLLM = _kinds(
    value="""--allowed-headers --allowed-media-domains --allowed-methods --allowed-origins --api-key
    --attention-backend --chat-template-content-format --code-revision --cohere-format --config-format
    --cpu-offload-params --custom-histogram-buckets --data-parallel-backend --default-chat-template-kwargs
    --disable-access-log-for-endpoints --fingerprint-value --hf-token --ignore-patterns --ir-op-priority
    --kv-cache-dtype --kv-cache-dtype-skip-layers --limit-mm-per-prompt --load-format --logits-processor-pattern
    --logprobs-mode --lora-target-modules --mamba-backend --media-io-kwargs --mm-encoder-attn-backend
    --mm-processor-device --mm-processor-kwargs --model-impl --numa-bind-cpus --offload-params
    --optimization-level --override-attention-dtype --override-generation-config --pt-load-map-location
    --quantization --reasoning-effort-map --reasoning-parser --response-role --revision --root-path
    --rope-scaling --safetensors-load-strategy --served-model-name --show-hidden-metrics-for-version
    --sleep-mode-backend --sleep-preserve-parameter-names --ssl-ciphers --tokenizer-mode
    --tokenizer-revision --tool-call-parser""",
    model="--model --tokenizer --spec-model",
    named_model="--lora-modules",
    path="--mm-encoder-fp8-scale-path",
    code="""--additional-config --attention-config --aux-output-config --chat-template --compilation-config
    --config --default-mm-loras --diffusion-config --distributed-executor-backend --ec-manager-config
    --ec-transfer-config --engram-config --eplb-config --fault-tolerance-config --generation-config
    --hf-config-path --hf-overrides --io-processor-plugin --kernel-config --kv-events-config
    --kv-transfer-config --log-config-file --logging-config --logits-processors --middleware
    --model-class-overrides --model-loader-extra-config --override-pooler-config --pooler-config
    --profiler-config --quantization-config --reasoning-config --reasoning-parser-plugin --scheduler-cls
    --speculative-config --structured-outputs-config --tool-parser-plugin --watchdog-config
    --watermark-config --weight-transfer-config --worker-cls --worker-extension-cls""",
    host="""--allowed-local-media-path --data-parallel-address --device-ids --download-dir --master-addr
    --mm-encoder-fp8-scale-save-path --otlp-traces-endpoint --ssl-ca-certs --ssl-certfile --ssl-keyfile
    --tool-server --uds""",
)

REPRO = _kinds(model="--model-path")

REVIEWED: dict[str, dict[str, FlagKind]] = {"sglang": SGLANG, "vllm": VLLM, "repro": REPRO}


def number_type(spec: dict[str, Any]) -> type | None:
    """int or float when the flag's values must parse as one."""
    return _NUMBER_TYPES.get(str(spec.get("type")))


def takes_no_value(spec: dict[str, Any]) -> bool:
    action = str(spec.get("action") or "")
    return bool(_SWITCH_ACTIONS.search(action)) or spec.get("nargs") == 0


def closed_choices(spec: dict[str, Any]) -> tuple[str, ...] | None:
    choices = spec.get("choices")
    if not choices or spec.get("choices_open") or spec.get("choices_unresolved"):
        return None
    return tuple(str(c) for c in choices)


def classify(family: str, flag: str, spec: dict[str, Any]) -> FlagKind | None:
    """The kind of `flag` (its canonical spelling) for a launcher family ("sglang", "vllm", "repro");
    None when it takes free text nobody has reviewed (the policy refuses it)."""
    reviewed = COMMON.get(flag) or REVIEWED.get(family, {}).get(flag)
    if reviewed is not None:
        return reviewed
    if takes_no_value(spec):
        return FlagKind.SWITCH
    if _HOST_NUMBER.search(flag):
        return FlagKind.HOST
    if number_type(spec) is not None or closed_choices(spec) is not None:
        return FlagKind.VALUE
    return None

"""Backend announcements: what attention / MoE / sampling / KV / quantization the server says it uses."""

from __future__ import annotations

from typing import ClassVar

from dispatchlab.core.lazyre import lazy_compile
from dispatchlab.core.parse.extract import Hits, group
from dispatchlab.core.parse.lineformat import Line
from dispatchlab.core.parse.model import Origin
from dispatchlab.core.parse.observations import Announcement, Observations

_VLLM_OLD_ATTENTION = {
    "Flash Attention": "FLASH_ATTN",
    "FlashInfer": "FLASHINFER",
    "Triton MLA": "TRITON_MLA",
    "FlashMLA": "FLASHMLA",
    "Cutlass MLA": "CUTLASS_MLA",
    "XFormers": "XFORMERS",
    "Torch SDPA": "TORCH_SDPA",
}
_GPTOSS_KERNEL = {"triton_kernels": "triton_kernel"}
_DRAFT_MENTION = lazy_compile(r"\bdraft\b|NextN|nextn|MTP")
# rule -> contract key, when the rule's `backend` group is the whole story and the model is the main one
_SIMPLE = {
    "attn_default": "attention_backend",
    "attn_autosel": "attention_backend",
    "attn_fa3_fp8": "attention_backend",
    "attn_dsa": "attention_backend",
    "kv_set": "kv_cache_dtype",
    "sampling_det": "sampling_backend",
    "vllm_moe": "moe_runner_backend",
}
_QUANT_DETECT = (
    r"^Detected (?P<what>fp8|nvfp4|ModelOpt FP8|w4afp8|int8|mxfp4|MXFP4) checkpoint|"
    r"^Detected that the model can run with (?P<marlin>\w+)|"
    r"^Draft model quantization \((?P<dq>[\w-]+)\) differs from main model quantization \((?P<mq>[\w-]+)\)|"
    r"^Auto-detected DSV4 routed-expert layout: is_fp4_experts=(?P<fp4e>True|False)"
)


class Backends:
    RULES: ClassVar[dict[str, str]] = {
        "attn_default": r"^Attention backend not (?:set|explicitly specified|specified)\. Use (?P<backend>\w+) backend by default\.",
        "attn_model": (
            r"^Use (?P<backend>\w+) as (?:the |default )?(?:(?P<phase>prefill|decode) )?attention backend "
            r"(?:on (?P<platform>[\w ]+?) )?for (?P<model>[\w\-]+)"
        ),
        "attn_autosel": r"^Auto-select (?P<backend>\w+) attention backend for (?P<model>\w+) on (?P<platform>\w+)\.",
        "attn_hybrid": r"^Using hybrid attention backend for decode and prefill: decode_backend=(?P<decode>\w+), prefill_backend=(?P<prefill>\w+)",
        "attn_draft": r"^Overriding draft attention backend to (?P<backend>\w+)\.",
        "attn_fa3_fp8": r"^FlashAttention3 only supports fp8_e4m3 if using FP8; Setting attention backend to (?P<backend>\w+)",
        "attn_dsa": r"^Use (?P<backend>dsa|nsa|dsv4) attention backend for",
        "moe_use": r"^Use (?P<backend>\w+) as MoE runner backend(?: on (?P<platform>[\w-]+))?(?: for (?P<target>.+?))?\.?$",
        "moe_gptoss": (
            r"^Detected (?:\w+ )?and MXFP4 quantization format for GPT-OSS model, enabling (?P<kernel>[\w ]+?) MOE kernel|"
            r"^GPT-OSS model.*?(?:enabling|using) (?P<kernel2>\w+) MOE kernel"
        ),
        "moe_deferred": r"^FlashInfer TRTLLM MoE deferred finalize is (?:enabled|disabled) \(moe_runner_backend=(?P<backend>\w+), quant_method=(?P<qm>\w+)\)",
        "kv_set": r"^Setting KV cache dtype to (?P<backend>\w+) for",
        "dsa_set": r"^Set (?:DSA|NSA) backends for (?P<kv>\w+) KV Cache: prefill=(?P<prefill>\w+), decode=(?P<decode>\w+)",
        "quant_detect": _QUANT_DETECT,
        "sampling_det": r"^Sampling backend is set to (?P<backend>\w+) for deterministic inference",
        "mm_attn": r"^(?:Using (?P<b1>\w+) as multimodal attention backend\.|Multimodal attention backend not set\. Use (?P<b2>\w+)\.)",
        "dsv4_prep": (
            r"^(?:Preparing DSv4 MXFP4 experts for FlashInfer (?P<arch>SM\d+) CUTLASS|"
            r"Shuffling FP4 expert weights for TRT-LLM MxFP4 kernel|Preparing MXFP4 experts for Marlin backend)"
        ),
        "vllm_attn": (
            r"Using (?:AttentionBackendEnum\.)?(?P<backend>[A-Z][A-Z0-9_]+) (?:attention )?backend"
            r"(?: out of potential backends| on V1 engine)?\.?"
        ),
        "vllm_attn_old": r"^Using (?P<backend>Flash Attention|FlashInfer|Triton MLA|FlashMLA|Cutlass MLA|XFormers|Torch SDPA) backend(?: on V1 engine)?\.",
        "vllm_moe": r"^Using '?(?P<backend>[A-Z][A-Z0-9_]+)'? (?P<quant>Mxfp4|NvFp4|Fp8|MxFp8|Unquantized) MoE backend",
        "vllm_moe_old": r"^Using (?P<backend>FlashInfer [\w ]+?|Marlin|Triton) (?:backend|kernels) for|^Using FlashInfer (?P<b2>MXFP4 [\w ]+?) backend",
        "vllm_sampler": r"^Using FlashInfer for top-p & top-k sampling|falling back to PyTorch-native sampler",
    }
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def announce(self, key: str, value: str, line: Line, model: str, *, weak: bool = False) -> None:
        origin = Origin(value=value, source="message", line=line.number, text=line.msg[:500])
        self.obs.announcements.append(Announcement(key, origin, model, weak))
        if not weak:
            self.obs.event(line, "backend", key, f"{key} = {value}: {line.msg[:300]}", model)

    def handle(self, line: Line, hits: Hits, following: bytes) -> bool:
        for rule, key in _SIMPLE.items():
            if rule in hits:
                self.announce(key, hits[rule].group("backend"), line, "main")
        self._attention(line, hits)
        self._moe(line, hits)
        self._quantization(line, hits)
        if "dsa_set" in hits:
            self.announce("dsa_prefill_backend", hits["dsa_set"].group("prefill"), line, "main")
            self.announce("dsa_decode_backend", hits["dsa_set"].group("decode"), line, "main")
        if "mm_attn" in hits:
            self.announce("mm_attention_backend", group(hits["mm_attn"], "b1", "b2") or "", line, "main")
        if "dsv4_prep" in hits:
            self.obs.event(line, "backend", "moe_experts", line.msg[:300])
        if "vllm_sampler" in hits:
            value = "flashinfer" if "Using FlashInfer" in line.msg else "pytorch"
            self.announce("sampling_backend", value, line, "main")
        return False

    def _attention(self, line: Line, hits: Hits) -> None:
        if "attn_model" in hits:
            g = hits["attn_model"]
            key = f"{g.group('phase')}_attention_backend" if g.group("phase") else "attention_backend"
            self.announce(key, g.group("backend"), line, "main")
        if "attn_hybrid" in hits:
            self.announce("decode_attention_backend", hits["attn_hybrid"].group("decode"), line, "main")
            self.announce("prefill_attention_backend", hits["attn_hybrid"].group("prefill"), line, "main")
        if "attn_draft" in hits:
            self.announce("attention_backend", hits["attn_draft"].group("backend"), line, "draft")
        if "vllm_attn" in hits and line.style != "sglang":
            backend = hits["vllm_attn"].group("backend")
            if backend not in ("DEBUG", "INFO"):
                self.announce("attention_backend", backend, line, "main")
        elif "vllm_attn_old" in hits:
            name = hits["vllm_attn_old"].group("backend")
            self.announce("attention_backend", _VLLM_OLD_ATTENTION.get(name, name), line, "main")

    def _moe(self, line: Line, hits: Hits) -> None:
        model = "draft" if _DRAFT_MENTION.search(line.msg) else "main"
        if "moe_use" in hits:
            self.announce("moe_runner_backend", hits["moe_use"].group("backend"), line, model)
        if "moe_gptoss" in hits:
            kernel = (group(hits["moe_gptoss"], "kernel", "kernel2") or "").strip().lower().replace(" ", "_")
            self.announce("moe_runner_backend", _GPTOSS_KERNEL.get(kernel, kernel), line, "main")
        if "moe_deferred" in hits:
            self.announce("moe_runner_backend", hits["moe_deferred"].group("backend"), line, model)
        if "vllm_moe_old" in hits and "vllm_moe" not in hits:
            value = (group(hits["vllm_moe_old"], "backend", "b2") or "").strip()
            self.announce("moe_runner_backend", value, line, "main")

    def _quantization(self, line: Line, hits: Hits) -> None:
        if "quant_detect" not in hits:
            return
        g = hits["quant_detect"]
        if g.group("dq"):
            self.announce("quantization", g.group("dq"), line, "draft")
            self.announce("quantization", g.group("mq"), line, "main", weak=True)
        elif g.group("what"):
            value = g.group("what").lower().replace("modelopt ", "modelopt_")
            self.announce("quantization", value, line, "main", weak=True)
            self.obs.event(line, "backend", "quantization_detected", line.msg[:300])
        elif g.group("marlin"):
            self.obs.event(line, "backend", "quantization_detected", line.msg[:300])

"""The line rules of the parser: milestones, backend announcements, environment dumps, failures.

Each rule is a regex over a line's message (prefix stripped). Rules must never match the routine
high-volume lines (batch statistics, access log); tests/core/test_scanner.py checks that.
"""

from __future__ import annotations

RULES: dict[str, str] = {
    # ---- arguments and launch ----
    "args_dump": r"server_args=ServerArgs\(|server_args=\{|^ServerArgs\(",
    "vllm_non_default": r"non-default args: \{",
    "vllm_engine_config": r"Initializing a V\d LLM engine \(v(?P<version>[^)]+)\) with config: |LLM engine \(v(?P<version2>[^)]+)\) with config:",
    "vllm_version": r"vLLM (?:API )?server version (?P<version>[\w.+-]+)|^vLLM Version\s*: (?P<version2>[\w.+-]+)",
    "launch": r"(?:python[\d.]*\s+-m\s+sglang\.launch_server|sglang\s+serve\s|python[\d.]*\s+-m\s+vllm\.entrypoints\.openai\.api_server|(?:^|[\s$>#])vllm\s+serve\s)",
    # ---- environment dumps (sglang check_env, vllm collect_env, nvidia-smi, pip lists) ----
    "env_gpu": r"^GPU (?P<ids>[\d,]+): (?P<name>.+)$",
    "env_gpu_cc": r"^GPU (?P<ids>[\d,]+) Compute Capability: (?P<cc>\d+\.\d+)",
    "env_kv": (
        r"^(?P<key>PyTorch|PyTorch version|sglang|sgl_kernel|sgl-kernel|sglang-kernel|flashinfer_python|flashinfer-python|"
        r"flashinfer|triton|vllm|vLLM Version|CUDA Driver Version|Nvidia driver version|NVCC|CUDA runtime version|"
        r"CUDA used to build PyTorch|CUDA available|ROCM available|Is CUDA available|Python|transformers)\s*:\s*(?P<value>\S.*)$"
    ),
    "env_gpu_models": r"^GPU models and configuration\s*:\s*(?P<value>.*)$",
    "env_pip": r"^\[(?:pip3?|conda)\] (?P<name>torch|triton|flashinfer[\w-]*|sgl[\w-]*kernel|sglang|vllm|nvidia-nccl-cu\d+)(?:==| +)(?P<version>[\w.+-]+)",
    "nvidia_smi_gpu": r"^\|\s+(?P<index>\d+)\s+(?P<name>NVIDIA [^|]*?)\s{2,}(?:On|Off)\s+\|",
    "nvidia_smi_driver": r"Driver Version: (?P<driver>[\d.]+)\s+CUDA Version: (?P<cuda>[\d.]+)",
    "torch_arch_warning": r"(?P<name>NVIDIA [\w .-]+?) with CUDA capability (?P<arch>sm_\d+) is not compatible",
    "device_statement": (
        r"[Cc]urrent device has SM ?\d|(?:compute|CUDA) capability[ :=]+\d+\.\d|capability \(\d+, \d\)|"
        r"kernels runnable on sm\d|\bgot SM ?\d{2,3}\b|on this GPU \(SM\d+\)|[Dd]etected (?:GPU )?(?:arch\w* )?sm_\d"
    ),
    "gpu_name_mention": (
        r"NVIDIA (?:GeForce |RTX )?(?:RTX PRO \d+|RTX \d{4}|[ABHL]\d{2,3}\w*|GB\d{2,3}|B\d{3}|H\d{2,3}|Tesla \w+)"
    ),
    "sglang_version_line": r"(?:sglang|SGLang)(?: version|==| v)[ :]?(?P<version>\d+\.\d+\.\d+[\w.+-]*)",
    # ---- SGLang milestones ----
    "init_dist_begin": r"^Init torch distributed begin\.",
    "init_dist_end": r"^Init torch distributed ends\.",
    "load_begin": r"^Load weight begin\. avail mem=(?P<avail>[\d.]+) GB",
    "load_end": (
        r"^Load weight end\. (?:elapsed=(?P<elapsed>[\d.]+) s, )?type=(?P<cls>\w+), (?:dtype=(?P<dtype>[\w.]+), )?"
        r"(?:quant=(?P<quant>[\w.-]+),[^a]*)?(?:avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<mem>-?[\d.]+) GB)?"
    ),
    "kv_alloc": (
        r"^KV Cache is allocated\. (?:dtype: (?P<dtype>[\w.]+), )?(?:#tokens: (?P<tokens>\d+), )?"
        r"(?:K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)?"
    ),
    "kv_dtype_old": r"^Using KV cache dtype: (?P<dtype>[\w.]+)",
    "mem_pool_end": r"^Memory pool end\. avail mem=(?P<avail>[\d.]+) GB",
    "cg_begin": (
        r"^Capture (?P<what>[\w -]*?)graph begin(?: \(step (?P<step>\d+)\))?\."
        r"(?:.*?backend=(?P<backend>\w+))?(?:.*?(?:bs|num_tokens)=(?P<sizes>\[[^\]]*\]))?(?:.*?avail mem=(?P<avail>[\d.]+) GB)?"
    ),
    "cg_sizes": r"^Capture (?:cuda|CUDA) graph (?:bs|num tokens) (?P<sizes>\[.*\])",
    "cg_end": (
        r"^Capture (?P<what>[\w -]*?)graph end(?: \(step \d+\))?\. (?:Time elapsed: (?P<t_old>[\d.]+) s|elapsed=(?P<t_new>[\d.]+) s)"
        r"(?:.*?mem usage=(?P<mem>-?[\d.]+) GB)?(?:.*?avail mem=(?P<avail>[\d.]+) GB)?"
    ),
    "cg_progress": r"^Capturing (?:batches|num tokens) \((?:bs=(?P<bs>\d+) )?avail_mem=(?P<avail>[\d.]+) GB\)",
    "max_total": r"^max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None), max_prefill_tokens=(?P<prefill>\d+), max_running_requests=(?P<running>\d+), context_len=(?P<ctx>\d+)",
    "uvicorn_up": r"Uvicorn running on (?P<url>\S+)",
    "ready": r"The server is fired up and ready to roll!",
    # ---- SGLang backend announcements ----
    "attn_default": r"^Attention backend not (?:set|explicitly specified|specified)\. Use (?P<backend>\w+) backend by default\.",
    "attn_model": r"^Use (?P<backend>\w+) as (?:the |default )?(?:(?P<phase>prefill|decode) )?attention backend (?:on (?P<platform>[\w ]+?) )?for (?P<model>[\w\-]+)",
    "attn_autosel": r"^Auto-select (?P<backend>\w+) attention backend for (?P<model>\w+) on (?P<platform>\w+)\.",
    "attn_hybrid": r"^Using hybrid attention backend for decode and prefill: decode_backend=(?P<decode>\w+), prefill_backend=(?P<prefill>\w+)",
    "attn_draft": r"^Overriding draft attention backend to (?P<backend>\w+)\.",
    "attn_fa3_fp8": r"^FlashAttention3 only supports fp8_e4m3 if using FP8; Setting attention backend to (?P<backend>\w+)",
    "attn_dsa": r"^Use (?P<backend>dsa|nsa|dsv4) attention backend for",
    "moe_use": r"^Use (?P<backend>\w+) as MoE runner backend(?: on (?P<platform>[\w-]+))?(?: for (?P<target>.+?))?\.?$",
    "moe_gptoss": r"^Detected (?:\w+ )?and MXFP4 quantization format for GPT-OSS model, enabling (?P<kernel>[\w ]+?) MOE kernel|^GPT-OSS model.*?(?:enabling|using) (?P<kernel2>\w+) MOE kernel",
    "moe_fusion": r"^(?P<which>FlashInfer TRTLLM routed MoE|FlashInfer TRTLLM MoE|FlashInfer CuteDSL MoE|Flashinfer MoE A2A) is enabled\.",
    "moe_deferred": r"^FlashInfer TRTLLM MoE deferred finalize is (?:enabled|disabled) \(moe_runner_backend=(?P<backend>\w+), quant_method=(?P<qm>\w+)\)",
    "moe_triton_cfg": r"^Using (?:MoE kernel config from|default MoE kernel config\.)",
    "kv_set": r"^Setting KV cache dtype to (?P<dtype>\w+) for",
    "dsa_set": r"^Set (?:DSA|NSA) backends for (?P<kv>\w+) KV Cache: prefill=(?P<prefill>\w+), decode=(?P<decode>\w+)",
    "quant_detect": (
        r"^Detected (?P<what>fp8|nvfp4|ModelOpt FP8|w4afp8|int8|mxfp4|MXFP4) checkpoint|"
        r"^Detected that the model can run with (?P<marlin>\w+)|"
        r"^Draft model quantization \((?P<dq>[\w-]+)\) differs from main model quantization \((?P<mq>[\w-]+)\)|"
        r"^Auto-detected DSV4 routed-expert layout: is_fp4_experts=(?P<fp4e>True|False)"
    ),
    "sampling_det": r"^Sampling backend is set to (?P<backend>\w+) for deterministic inference",
    "mm_attn": r"^(?:Using (?P<b1>\w+) as multimodal attention backend\.|Multimodal attention backend not set\. Use (?P<b2>\w+)\.)",
    "dsv4_prep": r"^(?:Preparing DSv4 MXFP4 experts for FlashInfer (?P<arch>SM\d+) CUTLASS|Shuffling FP4 expert weights for TRT-LLM MxFP4 kernel|Preparing MXFP4 experts for Marlin backend)",
    "lora_backend": r"^Using (?P<backend>\w+) as backend of LoRA kernels",
    # ---- vLLM milestones and announcements ----
    "vllm_attn": r"Using (?:AttentionBackendEnum\.)?(?P<backend>[A-Z][A-Z0-9_]+) (?:attention )?backend(?: out of potential backends| on V1 engine)?\.?",
    "vllm_attn_old": r"^Using (?P<backend>Flash Attention|FlashInfer|Triton MLA|FlashMLA|Cutlass MLA|XFormers|Torch SDPA) backend(?: on V1 engine)?\.",
    "vllm_moe": r"^Using '?(?P<backend>[A-Z][A-Z0-9_]+)'? (?P<quant>Mxfp4|NvFp4|Fp8|MxFp8|Unquantized) MoE backend",
    "vllm_moe_old": r"^Using (?P<backend>FlashInfer [\w ]+?|Marlin|Triton) (?:backend|kernels) for|^Using FlashInfer (?P<b2>MXFP4 [\w ]+?) backend",
    "vllm_sampler": r"^Using FlashInfer for top-p & top-k sampling|falling back to PyTorch-native sampler",
    "vllm_load_begin": r"^Starting to load model (?P<model>\S+?)\.*$",
    "vllm_load_end": r"^(?:Model loading took (?P<gib>[\d.]+) GiB|Loading weights took (?P<sec>[\d.]+) seconds)",
    "vllm_kv": r"^(?:Available KV cache memory: (?P<gib>[\d.]+) GiB|GPU KV cache size: (?P<tokens>[\d,]+) tokens)",
    "vllm_cg_progress": r"Capturing CUDA graphs? \(",
    "vllm_cg_end": r"^Graph capturing finished in (?P<sec>[\d.]+) secs?(?:, took (?P<gib>[\d.]+) GiB)?",
    "vllm_compile": r"^torch\.compile takes (?P<sec>[\d.]+) s in total|^Dynamo bytecode transform time",
    "vllm_init_engine": r"^init engine \(profile, create kv cache, warmup model\) took (?P<sec>[\d.]+)",
    "vllm_ready": r"Starting vLLM (?:API )?server on|^Application startup complete\.|Available routes are:",
    "vllm_platform": r"Automatically detected platform (?P<platform>\w+)\.",
    # ---- NCCL_DEBUG=INFO: the transport NCCL chose between two ranks ----
    "nccl_channel": (
        r"^NCCL INFO Channel \d+(?:/\d+)? ?: (?P<a>\d+)\[\d+\] -> (?P<b>\d+)\[\d+\] "
        r"(?:\[(?P<dir>send|receive)\] )?via (?P<via>[\w/.-]+)"
    ),
    "nccl_version": r"^NCCL INFO (?:cudaDriverVersion \d+ )?NCCL version (?P<version>\d+\.\d+\.\d+)",
    # ---- failures ----
    "exc_head": r"^(?P<comp>Scheduler|DetokenizerManager|TokenizerManager|DataParallelController|TpModelWorker|\w+) hit an exception: (?P<first>.*)$",
    "tb_start": r"Traceback \(most recent call last\):",
    "tb_frame": r"^\s*File \"(?P<file>[^\"]+)\", line (?P<line>\d+), in (?P<func>[^\s]+)",
    "exc_ignored": r"^Exception ignored in",
    "tb_chain": r"^\s*(?:The above exception was the direct cause of the following exception:|During handling of the above exception, another exception occurred:)",
    "tb_term": r"^(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)|Exception|(?:Base)?ExceptionGroup|KeyboardInterrupt|AssertionError|StopIteration)(?::\s?(?P<msg>.*))?$",
    "cpp_abort": r"^terminate called after throwing an instance of '(?P<type>[^']+)'|^\s*what\(\):\s+(?P<what>.*)$",
    "fatal_py": r"^Fatal Python error: (?P<what>.+)$",
    "signal": r"[Cc]aught signal (?P<sig>\d+)|[Rr]eceived signal (?P<sig2>\d+)|[Ss]ignal (?P<sig3>\d+) \((?P<name>SIG\w+)\) received|(?P<name2>SIGSEGV|SIGABRT|SIGBUS|SIGFPE|SIGKILL)\b",
    "exit_code": r"exit(?:ed)? (?:with )?(?:code|status)[: ]+(?P<code>-?\d+)|exitcode\s*:\s*(?P<code2>-?\d+)",
    "killed": r"^Killed$|Killed process \d+|oom-kill|Out of memory: Killed",
    # an operator's stop; a plain "Shutting down" also follows crashes, so it is not one
    "stop_request": (
        r"SIGTERM received|Received SIGTERM|SIGINT received|Received SIGINT|[Rr]eceived signal (?:2|15)\b|"
        r"Gracefully stopping|Application shutdown complete|Finished server process"
    ),
    "sigquit": r"^Received sigquit from a child process|^SIGQUIT received\.",
    "died_init": r"Rank (?P<rank>\d+) scheduler died during initialization \(exit code: (?P<code>-?\d+)\)",
    "subproc_crash": r"^Subprocess (?P<name>\S+) \(pid=(?P<pid>\d+)\) crashed with exit code (?P<code>-?\d+)",
    "init_failed": r"Initialization failed\. (?:Please see the error messages above\.|warmup error: )",
    "watchdog": r"(?:\w+ )?[Ww]atchdog timeout \(self\.watchdog_timeout=|Watchdog caught collective operation timeout",
    "cg_failed": r"Capture (?:[\w-]+ )*(?:cuda|CUDA|cpu) graph failed: (?P<inner>.*)$",
    "cuda_error": r"CUDA error: (?P<what>[^\n]*)|CUDA_ERROR_\w+|cudaError\w+|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|HIP error: (?P<hip>.*)|hipError\w+",
    "device_assert": r"device-side assert|Assertion `.*` failed|^Assertion failed: |Assertion failed\.",
    "nccl_error": r"NCCL (?:error|WARN)|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|ProcessGroupNCCL.*(?:[Tt]imeout|error)|DistBackendError",
    "oom": r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|Not enough memory\. Please try to increase",
    "vllm_engine_failed": r"EngineCore failed to start|Engine core initialization failed|EngineCore encountered (?:a fatal error|an issue)|WorkerProc (?:failed|hit an exception)|died unexpectedly",
    "error_level": r"^(?:ERROR|CRITICAL|FATAL)\b|\[E\] |\bFATAL\b",
    "warning_line": (
        r"^(?:WARNING|WARN)\b|\S+\.py:\d+: \w*Warning: |DeepGemm is enabled but the scale_fmt|"
        r"is deprecated|may cause|might cause|is not supported|not recommended|[Ff]alling back|fallback to"
    ),
    "kernel_name": (
        r"\b[Bb]mm_[A-Za-z0-9]+_\w+|\btrtllm_\w+|\bfmhaSm\d+\w*Kernel\w*|\w+\.cubin\b|\b\w+_kernel\b|"
        r"\bcutlass_\w+|\b\w*(?:Fmha|Gemm|Moe|MoE)Runner\b|\bErrorin function '\w+'|Error in function '(?P<func>\w+)'"
    ),
    "garbage_output": r"!!!!!!!!|\b(?:nan|NaN) (?:logits|values?|in logits)|logits contain (?:nan|NaN|inf)",
}

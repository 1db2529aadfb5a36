"""From raw log bytes to a ParsedLog: one streaming pass, Python work only on the interesting lines."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from dispatchlab.core import arch as archmod
from dispatchlab.core.chunkscan import (
    PARALLEL_MIN_BYTES,
    ChunkScan,
    parallel_workers,
    scan_chunk,
    scan_file_in_parallel,
)
from dispatchlab.core.document import Event, Frame, Origin, ParsedLog, PatternHit, Traceback
from dispatchlab.core.flags import defaults_by_field
from dispatchlab.core.lineformat import Line, split_line
from dispatchlab.core.reading import Source, decode_line, iter_chunks
from dispatchlab.core.rules import RULES
from dispatchlab.core.scanner import Scanner
from dispatchlab.core.serverargs import (
    canonical_sglang_flag,
    parse_launch_command,
    parse_server_args,
    parse_vllm_engine_config,
    parse_vllm_non_default,
)

ProgressCallback = Callable[[int, int | None], None]

MAX_TIMELINE_EVENTS = 4000
MAX_TRACEBACKS = 200
MAX_FRAMES = 80
MAX_HITS_PER_PATTERN = 25
METRIC_POINTS_TARGET = 1500
MAX_MSG = 2000
MAX_NCCL_TRANSPORTS = 256

# Contract keys of `backends`, with the SGLang ServerArgs fields they come from.
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

VLLM_OLD_ATTENTION = {
    "Flash Attention": "FLASH_ATTN",
    "FlashInfer": "FLASHINFER",
    "Triton MLA": "TRITON_MLA",
    "FlashMLA": "FLASHMLA",
    "Cutlass MLA": "CUTLASS_MLA",
    "XFormers": "XFORMERS",
    "Torch SDPA": "TORCH_SDPA",
}
# milestones that prove a process went on after an error it printed
PROGRESS = {
    "weights_begin",
    "weights_end",
    "kv_cache_allocated",
    "memory_pool_end",
    "cuda_graph_begin",
    "cuda_graph_end",
    "capacity",
    "http_up",
    "engine_ready",
    "ready",
}
STOP_EXIT_CODES = {"-15", "-2", "143", "130"}
WRAPPER_EXCEPTIONS = re.compile(
    r"Engine core initialization failed|EngineDeadError|EngineCore encountered an issue|"
    r"Initialization failed\.|scheduler died during initialization|Worker failed with error|"
    r"^SystemExit$|^KeyboardInterrupt$|ChildProcessError|^(?:Base)?ExceptionGroup\b"
)
DRAFT_FRAME = re.compile(
    r"speculative/|eagle_worker|eagle_draft|draft_|_nextn|nextn\.py|mtp|EagleDraft|multi_layer_eagle", re.I
)
CAPTURE_FRAME = re.compile(r"cuda_graph|capture|CudaGraphRunner|graph_runner", re.I)
LOAD_FRAME = re.compile(
    r"load_model|load_weights|model_loader|get_quant_method|create_weights|process_weights_after_loading|weight_loader"
)
KV_FRAME = re.compile(
    r"init_memory_pool|alloc_memory_pool|KVCacheConfigurator|profile_max_num_token|kv_cache|determine_available_memory|initialize_kv_cache"
)
RUNTIME_FRAME = re.compile(
    r"forward_extend|forward_decode|run_batch|event_loop|execute_model|step_with_batch_queue|_process_input_queue"
)
KERNEL_FUNC = re.compile(
    r"^(?:trtllm_\w+|[Bb]mm_\w+|\w+_kernel|cutlass_\w+|fmha\w*|\w*_moe|flashinfer_\w+|\w+_gemm\w*)$"
)
KERNEL_TEXT = re.compile(
    r"\b[Bb]mm_[A-Za-z0-9]+_[A-Za-z0-9_]+|\btrtllm_[a-z0-9_]+|\bfmhaSm\d+\w*Kernel\w*|\b[\w-]+\.cubin\b|"
    r"\b[a-z0-9_]+_kernel\b|\bcutlass_[a-z0-9_]+|\b[A-Z]\w*(?:Fmha|Gemm|Moe|MoE)\w*Runner\b"
)
NOT_KERNELS = {
    "sgl_kernel",
    "jit_kernel",
    "triton_kernel",
    "triton_kernels",
    "common_ops",
    "flashinfer_kernel",
}
ERRORISH = re.compile(
    r"[Ee]rror|[Ee]xception|[Ff]ail|[Uu]nsupported|not supported|[Aa]ssert|[Ff]atal|No kernel|no kernel|requires"
)
PHASE_ORDER = ["init", "weight_loading", "kv_cache", "cuda_graph_capture", "warmup", "serving"]


@dataclass
class _RankState:
    phase: str = "init"
    model: str = "main"
    phase_start_line: int = 0
    phase_start_time: str | None = None
    capture_open: bool = False


@dataclass
class _OpenTraceback:
    tb: Traceback
    chained: list[dict[str, str]] = field(default_factory=list)
    ignored: bool = False  # printed under "Exception ignored in": not fatal
    finished: bool = False  # the exception line was seen
    chained_pending: bool = False  # a "During handling..." line followed it


class LogParser:
    def __init__(self, extra_patterns: Sequence[str] = ()) -> None:
        self.rule_names = list(RULES)
        self.extra_base = len(self.rule_names)
        patterns = [RULES[n] for n in self.rule_names] + list(extra_patterns)
        self.scanner = Scanner(patterns)
        self.compiled = self.scanner.compiled

    # ---------------------------------------------------------------- driver
    def parse(self, sources: Sequence[Source], progress: ProgressCallback | None = None) -> ParsedLog:
        run = _Run(self)
        total = sum(s.stored_bytes or 0 for s in sources) or None
        if total and any(s.stored_bytes is None for s in sources):
            total = None
        run.stride = max(1, (total or 256 * METRIC_POINTS_TARGET) // METRIC_POINTS_TARGET)
        done = 0
        workers = parallel_workers()
        for source in sources:
            first = run.line_base + 1
            if source.path is not None and (source.stored_bytes or 0) >= PARALLEL_MIN_BYTES and workers > 1:
                scans: Iterable[ChunkScan] = scan_file_in_parallel(
                    self.scanner, source.path, source.stored_bytes or 0, run.stride, workers
                )
            else:
                scans = run.scan_source(source)
            for scan in scans:
                run.feed_scan(scan)
                if progress is not None:
                    done = min(done + scan.size, total) if total else done + scan.size
                    progress(done, total)
            run.doc.sources.append(
                {"name": source.name, "first_line": first, "line_count": run.line_base - first + 1}
            )
        return run.finish()


@lru_cache(maxsize=16)
def _parse_dump_cached(text: str) -> tuple[dict[str, Any], bool]:
    # a server that restarts prints the same 15 KB dump again: parse it once
    fields, complete = parse_server_args(text)
    return fields, complete


@lru_cache(maxsize=8)
def _parser_for(extra_patterns: tuple[str, ...]) -> LogParser:
    # compiling the multi-pattern database takes a moment: reuse it across logs (workers parse many)
    return LogParser(extra_patterns)


def parse_sources(
    sources: Sequence[Source], *, progress: ProgressCallback | None = None, extra_patterns: Sequence[str] = ()
) -> ParsedLog:
    return _parser_for(tuple(extra_patterns)).parse(sources, progress)


class _Run:
    """State of one parse."""

    def __init__(self, parser: LogParser) -> None:
        self.p = parser
        self.doc = ParsedLog()
        self.line_base = 0
        self.stride = 4096
        self.rank_state: dict[str | None, _RankState] = {}
        self.open_tb: dict[str | None, _OpenTraceback] = {}
        self.last_rank_context: str | None = None
        self.tb_seen: dict[tuple[str, str, tuple[str, ...]], Traceback] = {}
        self.year: str | None = None
        self.arch_strength = 0
        self.gpu_names: dict[int, str] = {}
        self.gpu_ccs: dict[int, str] = {}
        self.rocm = False
        self.server_votes = {"sglang": 0, "vllm": 0, "tensorrt_llm": 0}
        self.messages: list[tuple[str, Origin, str]] = []  # (key, origin, model) backend announcements
        self.milestones: list[
            tuple[int, str | None, str | None, str, str]
        ] = []  # line, time, rank, name, model
        self.ready_line: int | None = None
        self.first_decode_line: int | None = None
        self.last_metric_line: int | None = None
        self.kernels: dict[str, None] = {}
        self.error_keys: dict[str, dict[str, Any]] = {}
        self.fatal_lines: list[tuple[int, str | None, str, str]] = []  # line, rank, kind, text
        self.warning_keys: dict[str, int] = {}
        self.next_sample = 0
        self.metric_total = 0
        self.vllm_args: dict[str, Any] = {}
        self.launch_args: dict[str, Any] = {}
        self.last_time: str | None = None
        self.dump_line: int | None = None
        self.stop_requested = False
        self.stop_line: int | None = None
        self.ignore_next_tb: dict[str | None, bool] = {}
        self.ignored_tb_lines: set[int] = set()

    # ---------------------------------------------------------------- chunk loop
    def scan_source(self, source: Source) -> Iterator[ChunkScan]:
        for chunk in iter_chunks(source):
            scan = scan_chunk(self.p.scanner, chunk, self.stride, self.next_sample)
            self.next_sample = scan.next_sample
            yield scan

    def feed_scan(self, scan: ChunkScan) -> None:
        base = self.line_base
        samples = scan.samples
        si = 0
        for hit in scan.hits:
            while si < len(samples) and samples[si][0] < hit.index:
                self._metric_line(samples[si][1], base + samples[si][0] + 1)
                si += 1
            if hit.previous:
                before = split_line(base + hit.index, decode_line(hit.previous), self.year)
                if before.prefixed:  # "[ts] Tokenizer init failed:" then a bare traceback: that process's
                    self.last_rank_context = before.rank
            self._line(hit.raw, base + hit.index + 1, hit.rules, hit.following)
        for index, raw in samples[si:]:
            self._metric_line(raw, base + index + 1)
        self.line_base += scan.lines
        self.metric_total += scan.metric_lines
        points = self.doc.metrics["points"]
        while len(points) > 2 * METRIC_POINTS_TARGET:
            # the log is bigger than its stored size said (compressed, stdin): halve the resolution
            points = self.doc.metrics["points"] = points[::2]
            self.stride *= 2

    # ---------------------------------------------------------------- one line
    def _line(
        self, raw_bytes: bytes, number: int, rule_ids: tuple[int, ...] | None, following: bytes
    ) -> None:
        line = split_line(number, decode_line(raw_bytes), self.year)
        if line.time:
            if line.style == "sglang" and self.year is None:
                self.year = line.time[:4]
            self.last_time = line.time
        if line.prefixed:
            self.last_rank_context = line.rank
        if line.style == "sglang":
            self.server_votes["sglang"] += 1
        elif line.style == "vllm":
            self.server_votes["vllm"] += 1
        elif line.style == "trtllm":
            self.server_votes["tensorrt_llm"] += 3
        msg = line.msg
        compiled = self.p.compiled
        base = self.p.extra_base
        ids = range(len(compiled)) if rule_ids is None else rule_ids
        matched: dict[str, re.Match[str]] = {}
        for rule in ids:
            m = compiled[rule].search(msg)
            if m is None:
                continue
            if rule >= base:
                self._pattern_hit(rule - base, line, m)
            else:
                matched[self.p.rule_names[rule]] = m
        if matched:
            self._handle(line, matched, following)

    def _pattern_hit(self, index: int, line: Line, m: re.Match[str]) -> None:
        if (
            "server_args=ServerArgs(" in line.msg
            or "non-default args:" in line.msg
            or "with config:" in line.msg
        ):
            return
        hits = self.doc.pattern_hits.setdefault(index, [])
        if len(hits) < MAX_HITS_PER_PATTERN:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            hits.append(PatternHit(line.number, line.rank, line.msg[:MAX_MSG], groups))

    # ---------------------------------------------------------------- events
    def _event(self, line: Line, kind: str, name: str, detail: str, model: str | None = None) -> None:
        if len(self.doc.timeline) >= MAX_TIMELINE_EVENTS:
            self.doc.truncated_events += 1
            return
        self.doc.timeline.append(
            Event(line.number, line.time, line.rank, kind, name, detail[:MAX_MSG], model)
        )

    def _state(self, rank: str | None) -> _RankState:
        state = self.rank_state.get(rank)
        if state is None:
            state = self.rank_state[rank] = _RankState()
        return state

    def _milestone(
        self, line: Line, name: str, detail: str, model: str = "main", phase: str | None = None
    ) -> None:
        self._event(line, "phase", name, detail, model)
        self.milestones.append((line.number, line.time, line.rank, name, model))
        if phase:
            state = self._state(line.rank)
            state.phase = phase
            state.model = model

    def _handle(self, line: Line, m: dict[str, re.Match[str]], following: bytes) -> None:
        msg = line.msg
        # ---- arguments ----
        if "args_dump" in m:
            self._args_dump(line, following)
            return
        if "vllm_non_default" in m:
            self.server_votes["vllm"] += 5
            self.vllm_args.update(parse_vllm_non_default(msg[m["vllm_non_default"].start() :]))
            self._event(line, "backend", "args", "vLLM non-default args")
            return
        if "vllm_engine_config" in m:
            self.server_votes["vllm"] += 5
            g = m["vllm_engine_config"]
            version = g.group("version") or g.group("version2")
            self._version("vllm", version)
            config = parse_vllm_engine_config(msg)
            for key, value in config.items():
                self.vllm_args.setdefault(key, value)
            self._event(line, "backend", "engine_config", f"vLLM {version} engine config")
            return
        if "launch" in m:
            self._launch(line, following)
        if "vllm_version" in m:
            g = m["vllm_version"]
            self._version("vllm", g.group("version") or g.group("version2"))
            self.server_votes["vllm"] += 5
        # ---- environment ----
        self._environment(line, m)
        # ---- milestones and announcements ----
        self._sglang_milestones(line, m)
        self._vllm_milestones(line, m)
        self._announcements(line, m)
        # ---- failures ----
        self._failures(line, m)
        if "kernel_name" in m or "tb_frame" in m:
            self._kernels(line, m)
        if "nccl_channel" in m:
            self._nccl_channel(line, m["nccl_channel"])
        if "nccl_version" in m:
            self._version("nccl", m["nccl_version"].group("version"))
        if "warning_line" in m and not any(
            k in m for k in ("tb_term", "error_level", "cuda_error", "nccl_error", "oom")
        ):
            self._warning(line)

    def _nccl_channel(self, line: Line, g: re.Match[str]) -> None:
        transports = self.doc.nccl_transports
        if len(transports) >= MAX_NCCL_TRANSPORTS:
            return
        a, b, via = int(g.group("a")), int(g.group("b")), g.group("via")
        # Every channel of every collective repeats the same pair: keep one line per pair and path.
        if any(t["a"] == a and t["b"] == b and t["via"] == via for t in transports):
            return
        transports.append({"a": a, "b": b, "transport": via.split("/")[0], "via": via, "line": line.number})

    def _version(self, key: str, value: str | None) -> None:
        if value and value.lower() not in ("module not found", "n/a", "could not collect", "none"):
            value = value.strip().rstrip(".,")
            if not self.doc.versions.get(key):
                self.doc.versions[key] = value

    def _args_dump(self, line: Line, following: bytes) -> None:
        text = line.msg
        fields, complete = _parse_dump_cached(text)
        if not complete and following:
            # hard-wrapped dump (pasted into an issue): re-join following lines until the parentheses balance
            joined = text
            for raw in following.split(b"\n")[:400]:
                piece = decode_line(raw)
                if piece.startswith("[") and re.match(r"^\[\d{4}-\d\d-\d\d ", piece):
                    break
                joined += piece
                longer, complete = parse_server_args(joined)
                if complete or len(longer) > len(fields):
                    fields = longer
                if complete:
                    break
        self.server_votes["sglang"] += 10
        self.doc.server_args.update(fields)
        self.doc.server_args_complete = complete
        self.dump_line = line.number
        self._event(
            line,
            "backend",
            "server_args",
            f"ServerArgs dump, {len(fields)} fields" + ("" if complete else " (cut short)"),
        )

    def _launch(self, line: Line, following: bytes) -> None:
        text = line.msg.strip()
        m = re.search(r"(\S*python[\d.]*\s+-m\s+\S+|sglang\s+serve|vllm\s+serve)", text)
        if not m:
            return
        command = text[m.start() :]
        pieces = iter(following.split(b"\n")[:200])
        while command.rstrip().endswith("\\"):
            raw = next(pieces, None)
            if raw is None:
                break
            piece = re.sub(r"^>\s*", "", decode_line(raw).strip())
            command = command.rstrip()[:-1] + " " + piece
        if self.doc.launch_command and len(self.doc.launch_command) >= len(command):
            return
        self.doc.launch_command = command[:20000]
        self.launch_args = parse_launch_command(command)
        if "sglang" in command[:80]:
            self.server_votes["sglang"] += 5
        elif "vllm" in command[:80]:
            self.server_votes["vllm"] += 5
        self._event(line, "backend", "launch_command", command[:300])

    def _environment(self, line: Line, m: dict[str, re.Match[str]]) -> None:
        if "env_gpu_cc" in m:
            g = m["env_gpu_cc"]
            for i in g.group("ids").split(","):
                if i.strip().isdigit():
                    self.gpu_ccs[int(i)] = g.group("cc")
        elif "env_gpu" in m and "Compute Capability" not in line.msg:
            g = m["env_gpu"]
            for i in g.group("ids").split(","):
                if i.strip().isdigit():
                    self.gpu_names[int(i)] = re.sub(r"\s*\(UUID:.*$", "", g.group("name")).strip()
        if "env_gpu_models" in m:
            value = m["env_gpu_models"].group("value")
            gm = re.match(r"GPU (\d+): (.+)", value)
            if gm:
                self.gpu_names[int(gm.group(1))] = re.sub(r"\s*\(UUID:.*$", "", gm.group(2)).strip()
        if "nvidia_smi_gpu" in m:
            g = m["nvidia_smi_gpu"]
            self.gpu_names.setdefault(int(g.group("index")), g.group("name").strip())
        if "nvidia_smi_driver" in m:
            self._version("driver", m["nvidia_smi_driver"].group("driver"))
            self._version("cuda", m["nvidia_smi_driver"].group("cuda"))
        if "env_kv" in m:
            key = m["env_kv"].group("key")
            value = m["env_kv"].group("value").strip()
            mapping = {
                "PyTorch": "torch",
                "PyTorch version": "torch",
                "sglang": "sglang",
                "sgl_kernel": "sgl_kernel",
                "sgl-kernel": "sgl_kernel",
                "sglang-kernel": "sgl_kernel",
                "flashinfer_python": "flashinfer",
                "flashinfer-python": "flashinfer",
                "flashinfer": "flashinfer",
                "triton": "triton",
                "vllm": "vllm",
                "vLLM Version": "vllm",
                "CUDA Driver Version": "driver",
                "Nvidia driver version": "driver",
                "CUDA runtime version": "cuda",
                "CUDA used to build PyTorch": "cuda",
            }
            if key in mapping and re.match(r"^v?\d", value):
                self._version(mapping[key], value.split()[0].lstrip("v"))
            if key == "NVCC":
                rel = re.search(r"release (\d+\.\d+)", value)
                if rel:
                    self._version("cuda", rel.group(1))
            if key in ("PyTorch", "PyTorch version"):
                cu = re.search(r"\+cu(\d+)(\d)\b", value)
                if cu:
                    self._version("cuda", f"{cu.group(1)}.{cu.group(2)}")
            if key == "ROCM available" and value.startswith("True"):
                self.rocm = True
        if "env_pip" in m:
            name = m["env_pip"].group("name").lower()
            version = m["env_pip"].group("version")
            key = (
                "torch"
                if name == "torch"
                else "triton"
                if name == "triton"
                else "flashinfer"
                if name.startswith("flashinfer") and "cubin" not in name and "jit" not in name
                else "sgl_kernel"
                if "kernel" in name
                else "sglang"
                if name == "sglang"
                else "vllm"
                if name == "vllm"
                else None
            )
            if key:
                self._version(key, version)
        if "sglang_version_line" in m:
            self._version("sglang", m["sglang_version_line"].group("version"))
        if "torch_arch_warning" in m:
            g = m["torch_arch_warning"]
            self._arch(archmod.normalise_arch(g.group("arch")), 4)
            self.gpu_names.setdefault(0, g.group("name").strip())
        if "device_statement" in m:
            self._arch(archmod.arch_from_statement(line.msg), 3)
        if "gpu_name_mention" in m and not self.gpu_names:
            name_m = re.search(r"NVIDIA [\w .-]+?(?=\s{2}|[,;:)(|]|\swith\b|$)", line.msg)
            if name_m:
                arch = archmod.arch_from_gpu_name(name_m.group(0))
                if arch:
                    self._arch(arch, 2, name=name_m.group(0).strip())
        if self.arch_strength < 1 and ("kernel_name" in m or "tb_frame" in m or "device_statement" in m):
            self._arch(archmod.weak_arch_hint(line.msg), 1)

    def _arch(self, arch: str | None, strength: int, name: str | None = None) -> None:
        if arch and strength > self.arch_strength:
            self.doc.gpu["arch"] = arch
            self.arch_strength = strength
            if name and not self.doc.gpu.get("name"):
                self.doc.gpu["name"] = name

    def _sglang_milestones(self, line: Line, m: dict[str, re.Match[str]]) -> None:
        rank = line.rank
        if "init_dist_begin" in m:
            self._milestone(line, "init_dist_begin", line.msg, phase="init")
        elif "init_dist_end" in m:
            self._milestone(line, "init_dist_end", line.msg)
        elif "load_begin" in m:
            self._milestone(
                line, "weights_begin", line.msg, phase="weight_loading", model=self._model_of(rank)
            )
        elif "load_end" in m:
            g = m["load_end"]
            quant = g.group("quant")
            if quant and quant not in ("None", "none"):
                self._message_backend("quantization", quant, line, self._model_of(rank), weak=True)
            self._milestone(line, "weights_end", line.msg, phase="kv_cache", model=self._model_of(rank))
        elif "kv_alloc" in m:
            dtype = m["kv_alloc"].group("dtype")
            if dtype:
                self._message_backend(
                    "kv_cache_dtype", dtype.replace("torch.", ""), line, self._model_of(rank), weak=True
                )
            self._milestone(line, "kv_cache_allocated", line.msg, model=self._model_of(rank))
        elif "mem_pool_end" in m:
            self._milestone(line, "memory_pool_end", line.msg)
        elif "cg_begin" in m:
            what = (m["cg_begin"].group("what") or "").lower()
            model = "draft" if "draft" in what else "main"
            state = self._state(rank)
            state.capture_open = True
            self._milestone(line, "cuda_graph_begin", line.msg, model=model, phase="cuda_graph_capture")
        elif "cg_end" in m:
            what = (m["cg_end"].group("what") or "").lower()
            model = "draft" if "draft" in what else "main"
            self._state(rank).capture_open = False
            self._milestone(line, "cuda_graph_end", line.msg, model=model, phase="warmup")
        elif "max_total" in m:
            self._milestone(line, "capacity", line.msg, phase="warmup")
        elif "uvicorn_up" in m:
            self._milestone(line, "http_up", line.msg)
        elif "ready" in m:
            self.ready_line = self.ready_line or line.number
            self._milestone(line, "ready", line.msg, phase="serving")
            for state in self.rank_state.values():
                state.phase = "serving"

    def _model_of(self, rank: str | None) -> str:
        state = self.rank_state.get(rank)
        return state.model if state and state.phase == "cuda_graph_capture" else "main"

    def _vllm_milestones(self, line: Line, m: dict[str, re.Match[str]]) -> None:
        if "vllm_load_begin" in m:
            self.server_votes["vllm"] += 2
            self._milestone(line, "weights_begin", line.msg, phase="weight_loading")
            if not self.doc.model:
                self.doc.model = m["vllm_load_begin"].group("model").rstrip(".")
        elif "vllm_load_end" in m:
            self._milestone(line, "weights_end", line.msg, phase="kv_cache")
        elif "vllm_kv" in m:
            self._milestone(line, "kv_cache_allocated", line.msg, phase="kv_cache")
        elif "vllm_cg_progress" in m:
            state = self._state(line.rank)
            if state.phase != "cuda_graph_capture" and not state.capture_open:
                state.capture_open = True
                self._milestone(line, "cuda_graph_begin", line.msg, phase="cuda_graph_capture")
        elif "vllm_cg_end" in m:
            self._state(line.rank).capture_open = False
            self._milestone(line, "cuda_graph_end", line.msg, phase="warmup")
        elif "vllm_init_engine" in m:
            self._milestone(line, "engine_ready", line.msg, phase="warmup")
        elif "vllm_ready" in m and self.ready_line is None:
            self.ready_line = line.number
            self._milestone(line, "ready", line.msg, phase="serving")
            for state in self.rank_state.values():
                state.phase = "serving"
        if "vllm_platform" in m:
            self.server_votes["vllm"] += 3

    def _message_backend(self, key: str, value: str, line: Line, model: str, *, weak: bool = False) -> None:
        origin = Origin(value=value, source="message", line=line.number, text=line.msg[:500])
        self.messages.append((key, origin, model + ("?" if weak else "")))
        if not weak:
            self._event(line, "backend", key, f"{key} = {value}: {line.msg[:300]}", model)

    def _announcements(self, line: Line, m: dict[str, re.Match[str]]) -> None:
        draft = "draft" if re.search(r"\bdraft\b|NextN|nextn|MTP", line.msg) else "main"
        if "attn_default" in m:
            self._message_backend("attention_backend", m["attn_default"].group("backend"), line, "main")
        if "attn_model" in m:
            g = m["attn_model"]
            key = f"{g.group('phase')}_attention_backend" if g.group("phase") else "attention_backend"
            self._message_backend(key, g.group("backend"), line, "main")
        if "attn_autosel" in m:
            self._message_backend("attention_backend", m["attn_autosel"].group("backend"), line, "main")
        if "attn_hybrid" in m:
            self._message_backend("decode_attention_backend", m["attn_hybrid"].group("decode"), line, "main")
            self._message_backend(
                "prefill_attention_backend", m["attn_hybrid"].group("prefill"), line, "main"
            )
        if "attn_draft" in m:
            self._message_backend("attention_backend", m["attn_draft"].group("backend"), line, "draft")
        if "attn_fa3_fp8" in m:
            self._message_backend("attention_backend", m["attn_fa3_fp8"].group("backend"), line, "main")
        if "attn_dsa" in m:
            self._message_backend("attention_backend", m["attn_dsa"].group("backend"), line, "main")
        if "moe_use" in m:
            self._message_backend("moe_runner_backend", m["moe_use"].group("backend"), line, draft)
        if "moe_gptoss" in m:
            g = m["moe_gptoss"]
            kernel = (g.group("kernel") or g.group("kernel2") or "").strip().lower().replace(" ", "_")
            mapping = {
                "flashinfer_mxfp4": "flashinfer_mxfp4",
                "triton_kernels": "triton_kernel",
                "triton_kernel": "triton_kernel",
            }
            self._message_backend("moe_runner_backend", mapping.get(kernel, kernel), line, "main")
        if "moe_deferred" in m:
            self._message_backend("moe_runner_backend", m["moe_deferred"].group("backend"), line, draft)
        if "kv_set" in m:
            self._message_backend("kv_cache_dtype", m["kv_set"].group("dtype"), line, "main")
        if "dsa_set" in m:
            self._message_backend("dsa_prefill_backend", m["dsa_set"].group("prefill"), line, "main")
            self._message_backend("dsa_decode_backend", m["dsa_set"].group("decode"), line, "main")
        if "quant_detect" in m:
            g = m["quant_detect"]
            if g.group("dq"):
                self._message_backend("quantization", g.group("dq"), line, "draft")
                self._message_backend("quantization", g.group("mq"), line, "main", weak=True)
            elif g.group("what"):
                self._message_backend(
                    "quantization",
                    g.group("what").lower().replace("modelopt ", "modelopt_"),
                    line,
                    "main",
                    weak=True,
                )
                self._event(line, "backend", "quantization_detected", line.msg[:300])
            elif g.group("marlin"):
                self._event(line, "backend", "quantization_detected", line.msg[:300])
        if "sampling_det" in m:
            self._message_backend("sampling_backend", m["sampling_det"].group("backend"), line, "main")
        if "mm_attn" in m:
            g = m["mm_attn"]
            self._message_backend("mm_attention_backend", g.group("b1") or g.group("b2"), line, "main")
        if "dsv4_prep" in m:
            self._event(line, "backend", "moe_experts", line.msg[:300])
        if "vllm_attn" in m and line.style != "sglang":
            backend = m["vllm_attn"].group("backend")
            if backend not in ("DEBUG", "INFO"):
                self._message_backend("attention_backend", backend, line, "main")
        elif "vllm_attn_old" in m:
            name = m["vllm_attn_old"].group("backend")
            self._message_backend("attention_backend", VLLM_OLD_ATTENTION.get(name, name), line, "main")
        if "vllm_moe" in m:
            self._message_backend("moe_runner_backend", m["vllm_moe"].group("backend"), line, "main")
        elif "vllm_moe_old" in m:
            g = m["vllm_moe_old"]
            self._message_backend(
                "moe_runner_backend", (g.group("backend") or g.group("b2") or "").strip(), line, "main"
            )
        if "vllm_sampler" in m:
            value = "flashinfer" if "Using FlashInfer" in line.msg else "pytorch"
            self._message_backend("sampling_backend", value, line, "main")

    # ---------------------------------------------------------------- failures
    def _tb_key(self, line: Line) -> str | None:
        if line.prefixed and line.rank is not None:
            return line.rank
        if line.prefixed:
            return None
        return self.last_rank_context

    def _failures(self, line: Line, m: dict[str, re.Match[str]]) -> None:
        key = self._tb_key(line)
        msg = line.msg
        open_tb = self.open_tb.get(key)
        if "tb_start" in m:
            chain: list[dict[str, str]] = []
            if open_tb is not None:
                if open_tb.chained_pending and open_tb.tb.exception:
                    # "During handling ... / The above exception ...": the new traceback continues this one
                    chain = [
                        *open_tb.chained,
                        {"exception": open_tb.tb.exception, "message": open_tb.tb.message},
                    ]
                    first_line = open_tb.tb.line
                    root_frames = open_tb.tb.frames
                    self.ignore_next_tb[key] = open_tb.ignored
                    self.open_tb.pop(key)
                else:
                    self._close_tb(key)
            tb = Traceback(line=line.number, rank=line.rank or key, exception="", message="")
            if chain:
                tb.line = first_line
                tb.frames = list(root_frames)  # the cause's frames say where it really broke
            self.open_tb[key] = _OpenTraceback(tb, chain, ignored=self.ignore_next_tb.pop(key, False))
            if "exc_head" in m:
                self._event(line, "error", "exception", msg[:300])
            return
        if "exc_ignored" in m:
            # "Exception ignored in: <function X.__del__>": CPython printed and swallowed it
            self.ignore_next_tb[key] = True
            return
        if "tb_chain" in m:
            if open_tb is not None:
                open_tb.chained_pending = True
            return
        if "tb_frame" in m:
            if open_tb is None or open_tb.finished:
                if open_tb is not None:
                    self._close_tb(key)
                open_tb = self.open_tb[key] = _OpenTraceback(
                    Traceback(line=line.number, rank=line.rank or key, exception="", message="")
                )
            g = m["tb_frame"]
            if len(open_tb.tb.frames) < MAX_FRAMES:
                open_tb.tb.frames.append(Frame(g.group("file"), int(g.group("line")), g.group("func")))
            return
        if "tb_term" in m and not msg.startswith((" ", "\t")):
            g = m["tb_term"]
            exc, text = g.group("exc"), (g.group("msg") or "").strip()
            if open_tb is None:
                tb = Traceback(line=line.number, rank=line.rank or key, exception=exc, message=text[:MAX_MSG])
                tb.end_line = line.number
                self.open_tb[key] = _OpenTraceback(tb, finished=True)
            elif not open_tb.finished:
                open_tb.tb.exception = exc
                open_tb.tb.message = text[:MAX_MSG]
                open_tb.tb.end_line = line.number
                open_tb.finished = True
            # else: the same exception printed again (Python 3.11 notes, logger.exception): keep the first
            return
        if "stop_request" in m:
            self.stop_requested = True
            self.stop_line = self.stop_line or line.number
            self._milestone(line, "stop_requested", msg[:300])
            return
        # error lines outside tracebacks
        kind: str | None = None
        for name in (
            "cg_failed",
            "cuda_error",
            "device_assert",
            "nccl_error",
            "oom",
            "fatal_py",
            "cpp_abort",
            "died_init",
            "subproc_crash",
            "watchdog",
            "killed",
            "signal",
            "exit_code",
            "init_failed",
            "vllm_engine_failed",
            "sigquit",
            "garbage_output",
        ):
            if name in m:
                kind = name
                break
        if kind is None and "error_level" in m:
            kind = "error"
        if kind is None and "exc_head" in m:
            kind = "exception"
        if kind is None:
            return
        if kind in ("exit_code", "subproc_crash"):
            g = m[kind]
            code = g.group("code") or (g.group("code2") if kind == "exit_code" else None)
            if code in ("0", None):
                return
            if code in STOP_EXIT_CODES and self.stop_requested:
                return  # the operator stopped the server (SIGTERM / Ctrl-C): children exit with the signal
        if kind == "signal" and not re.search(
            r"SIG(?:SEGV|ABRT|BUS|FPE|KILL|ILL)|signal (?:4|6|7|8|9|11)\b", msg
        ):
            return
        self._error(line, kind)

    def _error(self, line: Line, kind: str) -> None:
        text = line.msg.strip()
        norm = re.sub(r"0x[0-9a-fA-F]+|\d+", "#", text)[:300]
        entry = self.error_keys.get(norm)
        if entry is not None:
            entry["count"] += 1
            if line.rank and line.rank not in entry["ranks"]:
                entry["ranks"].append(line.rank)
            return
        fatal = kind not in (
            "error",
            "sigquit",
            "garbage_output",
            "init_failed",
            "vllm_engine_failed",
            "exception",
        )
        if line.level in ("WARNING", "INFO", "DEBUG") or re.search(r"NCCL (?:WARN|INFO)", text):
            fatal = False  # a warning that mentions OOM or a failed NCCL transport is not the failure itself
        if self.stop_requested and kind in ("killed", "signal", "exit_code", "subproc_crash", "died_init"):
            fatal = False  # children dying after the operator stopped the server
        entry = {
            "line": line.number,
            "rank": line.rank,
            "ranks": [line.rank] if line.rank else [],
            "kind": kind,
            "text": text[:MAX_MSG],
            "count": 1,
            "time": line.time,
            "fatal": fatal,
        }
        self.error_keys[norm] = entry
        if fatal or kind == "garbage_output":
            self.fatal_lines.append((line.number, line.rank, kind, text))
        self._event(line, "error", kind, text[:300])

    def _close_tb(self, key: str | None) -> None:
        open_tb = self.open_tb.pop(key, None)
        if open_tb is None:
            return
        tb = open_tb.tb
        if open_tb.ignored:
            self.ignored_tb_lines.add(tb.line)
        if not tb.exception:
            if not tb.frames:
                return
            tb.exception = "(traceback cut off)"
        tb.chain = open_tb.chained
        signature = (
            tb.exception,
            re.sub(r"0x[0-9a-fA-F]+|\d+", "#", tb.message)[:200],
            tuple(f"{f.file.rsplit('/', 1)[-1]}:{f.function}" for f in tb.frames[-12:]),
        )
        seen = self.tb_seen.get(signature)
        if seen is not None:
            seen.count += 1
            if tb.rank and tb.rank not in seen.ranks:
                seen.ranks.append(tb.rank)
            return
        if tb.rank:
            tb.ranks = [tb.rank]
        if len(self.doc.tracebacks) < MAX_TRACEBACKS:
            self.doc.tracebacks.append(tb)
            self.tb_seen[signature] = tb
            self.doc.timeline.append(
                Event(
                    tb.line, None, tb.rank, "error", "traceback", f"{tb.exception}: {tb.message[:250]}", None
                )
            )
        for frame in tb.frames:
            if KERNEL_FUNC.match(frame.function) and frame.function not in ("<module>",):
                self._kernel(frame.function)

    def _kernels(self, line: Line, m: dict[str, re.Match[str]]) -> None:
        msg = line.msg
        in_tb = self._tb_key(line) in self.open_tb
        if "tb_frame" in m and not ERRORISH.search(msg):
            return
        if not (in_tb or ERRORISH.search(msg) or line.level in ("ERROR", "CRITICAL")):
            return
        for km in KERNEL_TEXT.finditer(msg):
            name = km.group(0)
            before, after = msg[max(0, km.start() - 1) : km.start()], msg[km.end() : km.end() + 1]
            if before in ('"', "/") or (before == "." and after != "("):
                continue  # a path, a quoted file name or a module (`flashinfer.jit.x_kernel`), not a kernel
            self._kernel(name)

    def _kernel(self, name: str) -> None:
        if name in NOT_KERNELS or len(self.kernels) >= 100:
            return
        self.kernels.setdefault(name, None)

    def _warning(self, line: Line) -> None:
        if line.level in ("INFO", "DEBUG") and not re.search(r"Warning|DeepGemm|deprecated", line.msg):
            return
        norm = re.sub(r"0x[0-9a-fA-F]+|\d+", "#", line.msg)[:200]
        self.doc.warnings_count += 1
        if norm in self.warning_keys:
            return
        self.warning_keys[norm] = line.number
        if len(self.warning_keys) <= 300:
            self._event(line, "warning", "warning", line.msg[:300])

    # ---------------------------------------------------------------- metrics
    def _metric_line(self, raw: bytes, number: int) -> None:
        line = split_line(number, decode_line(raw), self.year)
        msg = line.msg
        point: dict[str, Any] = {"line": number, "time": line.time, "rank": line.rank}
        if msg.startswith("Decode batch"):
            point["kind"] = "decode"
            self.first_decode_line = self.first_decode_line or number
        elif msg.startswith("Prefill batch"):
            point["kind"] = "prefill"
        elif "Avg prompt throughput" in msg:
            point["kind"] = "vllm"
            self.first_decode_line = self.first_decode_line or number
        else:
            return
        for field_name, pattern in _METRIC_FIELDS:
            mm = pattern.search(msg)
            point[field_name] = _number(next((g for g in mm.groups() if g is not None), None)) if mm else None
        if point.get("token_usage") is not None and point["kind"] == "vllm":
            point["token_usage"] = point["token_usage"] / 100.0
        self.last_metric_line = number
        self.doc.metrics["points"].append(point)
        if line.time:
            self.last_time = line.time

    # ---------------------------------------------------------------- assembly
    def finish(self) -> ParsedLog:
        for key in list(self.open_tb):
            self._close_tb(key)
        doc = self.doc
        doc.line_count = self.line_base
        doc.metrics["total"] = self.metric_total
        points = doc.metrics["points"]
        doc.metrics["sampled_every"] = max(1, round(self.metric_total / len(points))) if points else 1
        doc.kernels = list(self.kernels)
        doc.errors = sorted(self.error_keys.values(), key=lambda e: e["line"])[:500]
        doc.timeline.sort(key=lambda e: e.line)
        self._server()
        self._gpu()
        self._backends()
        self._crash()
        self._phases()
        self._outcome()
        ranks = {e.rank for e in doc.timeline if e.rank} | {p["rank"] for p in points if p.get("rank")}
        doc.ranks = sorted(ranks, key=_rank_sort_key)
        # vLLM and glog timestamps carry no year: take it from any dated line, else mark it as a placeholder
        doc.time_year_known = self.year is not None or not any(
            e.time and e.time.startswith("0000") for e in doc.timeline
        )
        self._fix_years(self.year or "1900")
        return doc

    def _fix_years(self, year: str) -> None:
        def fix(value: str | None) -> str | None:
            return year + value[4:] if value and value.startswith("0000") else value

        for event in self.doc.timeline:
            event.time = fix(event.time)
        for item in [*self.doc.metrics["points"], *self.doc.errors]:
            item["time"] = fix(item["time"])
        for phase in self.doc.phases:
            phase["start"], phase["end"] = fix(phase["start"]), fix(phase["end"])

    def _server(self) -> None:
        doc = self.doc
        votes = self.server_votes
        best = max(votes, key=lambda k: votes[k])
        if votes[best] == 0:
            if any("sglang" in f.file for tb in doc.tracebacks for f in tb.frames):
                best = "sglang"
            elif any("vllm" in f.file for tb in doc.tracebacks for f in tb.frames):
                best = "vllm"
            elif any("tensorrt_llm" in f.file for tb in doc.tracebacks for f in tb.frames):
                best = "tensorrt_llm"
            else:
                best = ""
        if not best:
            best = "sglang" if doc.versions.get("sglang") else "vllm" if doc.versions.get("vllm") else ""
        doc.engine = best or None
        doc.server = best if best in ("sglang", "vllm") else "unknown"
        if doc.server in ("sglang", "vllm"):
            doc.server_version = doc.versions.get(doc.server)
        if doc.server == "vllm":
            merged = dict(self.vllm_args)
            doc.server_args = {**doc.server_args, **merged}
        if self.launch_args:
            for key, value in self.launch_args.items():
                name = canonical_sglang_flag(key) if doc.server == "sglang" else key
                doc.server_args.setdefault(name, value)
        args = doc.server_args
        model = args.get("model_path") or args.get("model") or doc.model
        if isinstance(model, str) and model:
            doc.model = model
        elif not doc.model:
            loaded = next((e.detail for e in doc.timeline if e.name == "weights_end"), None)
            cls = re.search(r"type=(\w+)", loaded or "")
            doc.model = cls.group(1) if cls else None

    def _gpu(self) -> None:
        gpu = self.doc.gpu
        names = self.gpu_names
        if names:
            first = names[min(names)]
            gpu["name"] = first
            gpu["count"] = len(names)
            if self.arch_strength < 4:
                arch = archmod.arch_from_gpu_name(first)
                if arch and (self.arch_strength < 3 or arch.startswith("gfx")):
                    gpu["arch"] = arch
                    self.arch_strength = 2
        if self.gpu_ccs:
            cc = self.gpu_ccs[min(self.gpu_ccs)]
            gpu["compute_capability"] = cc
            rocm = self.rocm or bool(names and archmod.ROCM_NAME.search(names[min(names)]))
            arch = archmod.arch_from_capability(cc, rocm=rocm)
            if arch:
                gpu["arch"] = arch
            if gpu["count"] is None:
                gpu["count"] = len(self.gpu_ccs)
        if gpu.get("arch") and not gpu.get("compute_capability"):
            gpu["compute_capability"] = archmod.capability_of(gpu["arch"])
        if gpu["count"] is None:
            args = self.doc.server_args
            tp = args.get("tp_size") or args.get("tensor_parallel_size") or args.get("tp")
            dp = args.get("dp_size") or args.get("data_parallel_size") or 1
            pp = args.get("pp_size") or args.get("pipeline_parallel_size") or 1
            if isinstance(tp, int) and isinstance(dp, int) and isinstance(pp, int):
                # DP attention splits the TP group's GPUs; plain DP replicates them
                gpu["count"] = tp * pp * (1 if args.get("enable_dp_attention") else dp)

    def _backends(self) -> None:
        doc = self.doc
        args = doc.server_args
        launch = {canonical_sglang_flag(k) if doc.server == "sglang" else k for k in self.launch_args}
        fields = SGLANG_BACKEND_FIELDS if doc.server != "vllm" else VLLM_BACKEND_FIELDS
        defaults = (
            defaults_by_field(doc.server, doc.server_version) if doc.server in ("sglang", "vllm") else {}
        )
        for key, field_name in fields.items():
            value = args.get(field_name)
            if value is None or isinstance(value, (dict, list)):
                continue
            source = "flag" if field_name in launch else "args"
            if source == "args" and field_name in defaults and defaults[field_name] == value:
                source = "default"  # the catalog of this release says nobody had to set it
            doc.backend_origins[key] = Origin(str(value), source, self.dump_line, None)
        # messages: a concrete announcement refines `auto`/None or confirms the dump
        for key, origin, model in self.messages:
            weak = model.endswith("?")
            model = model.rstrip("?")
            target = doc.backend_origins if model == "main" else doc.draft_backend_origins
            current = target.get(key)
            if (
                current is None
                or current.value in ("auto", "None", "")
                or (not weak and current.source != "flag")
            ):
                if weak and current is not None and current.value not in ("auto", "None", ""):
                    continue
                target[key] = origin
        # draft model
        spec = args.get("speculative_algorithm")
        if spec or doc.draft_backend_origins:
            self._draft_backends()
        doc.backends = {k: v.value for k, v in doc.backend_origins.items()}
        doc.draft_backends = {k: v.value for k, v in doc.draft_backend_origins.items()}

    def _draft_backends(self) -> None:
        doc = self.doc
        args = doc.server_args
        main = doc.backend_origins
        draft = doc.draft_backend_origins
        launch = {canonical_sglang_flag(k) for k in self.launch_args}

        def from_arg(key: str, field_name: str) -> None:
            if key in draft:
                return
            value = args.get(field_name)
            if value is not None and not isinstance(value, (dict, list)):
                draft[key] = Origin(
                    str(value), "flag" if field_name in launch else "args", self.dump_line, field_name
                )

        def inherit(key: str, why: str) -> None:
            if key not in draft and key in main:
                inherited = main[key]
                draft[key] = Origin(inherited.value, "inherited", inherited.line, why)

        from_arg("moe_runner_backend", "speculative_moe_runner_backend")
        inherit("moe_runner_backend", "speculative_moe_runner_backend not set: inherits the main model's")
        from_arg("moe_a2a_backend", "speculative_moe_a2a_backend")
        inherit("moe_a2a_backend", "speculative_moe_a2a_backend not set: inherits the main model's")
        from_arg("attention_backend", "speculative_draft_attention_backend")
        mode = args.get("speculative_attention_mode")
        if "attention_backend" not in draft:
            phase_key = "decode_attention_backend" if mode == "decode" else "prefill_attention_backend"
            if phase_key in main:
                draft["attention_backend"] = Origin(
                    main[phase_key].value,
                    "inherited",
                    main[phase_key].line,
                    f"speculative_attention_mode={mode}",
                )
        inherit("attention_backend", "no draft attention backend set: uses the main model's")
        from_arg("quantization", "speculative_draft_model_quantization")
        for key in list(main):
            if key not in ("quantization",) and not key.startswith(("prefill_", "decode_")):
                inherit(key, "shared with the main model")
        if args.get("speculative_algorithm"):
            draft.setdefault(
                "speculative_algorithm",
                Origin(str(args["speculative_algorithm"]), "args", self.dump_line, None),
            )

    def _crash(self) -> None:
        doc = self.doc
        candidates: list[tuple[int, str | None, str, str, list[Frame], list[str]]] = []
        for tb in doc.tracebacks:
            exception = "" if tb.exception == "(traceback cut off)" else tb.exception
            candidates.append((tb.line, tb.rank, exception, tb.message, tb.frames, tb.ranks))
        for line, rank, kind, text in self.fatal_lines:
            if kind == "garbage_output":
                continue
            candidates.append((line, rank, "", text, [], [rank] if rank else []))
        candidates = [c for c in sorted(candidates, key=lambda c: c[0]) if not self._not_fatal(c)]
        if self.ready_line is not None:
            candidates = [c for c in candidates if c[0] > self.ready_line]
        if not candidates:
            doc.crash = None
            return
        real = [c for c in candidates if not WRAPPER_EXCEPTIONS.search(f"{c[2]} {c[3]}")]
        with_exc = [c for c in real if c[2]]
        # first rank to fail: the earliest exception; error lines only when no traceback explains the failure
        # an exception group only contains the failure: a sub-exception, even a wrapper, says more
        specific = [c for c in candidates if not re.match(r"(?:Base)?ExceptionGroup$", c[2])] or candidates
        chosen = with_exc[0] if with_exc else (real[0] if real else specific[0])
        line, rank, exception, message, frames, ranks = chosen
        crash_tb = next((t for t in doc.tracebacks if t.line == line), None)
        inner = re.search(r"Capture (?:[\w-]+ )*(?:cuda|CUDA|cpu) graph failed: (.*)", message)
        if crash_tb is not None and crash_tb.chain:
            root = crash_tb.chain[0]
            exception, message = root["exception"], root["message"] or message
        phase, model = self._phase_at(line, rank, frames)
        if inner:
            phase = "cuda_graph_capture"
        all_ranks = sorted(
            {r for c in candidates if not WRAPPER_EXCEPTIONS.search(f"{c[2]} {c[3]}") for r in c[5] if r}
            | set(ranks),
            key=_rank_sort_key,
        )
        doc.crash = {
            "line": line if crash_tb is None else crash_tb.line,
            "phase": phase,
            "exception": exception or None,
            "message": (message or "")[:MAX_MSG],
            "rank": rank,
            "ranks": all_ranks,
            "model": model,
        }
        time = next((e.time for e in doc.timeline if e.line >= line and e.time), None)
        self._event(
            Line(line, "", "", time, rank),
            "error",
            "crash",
            f"{exception or 'fatal'}: {message[:250]}",
            model,
        )
        doc.timeline.sort(key=lambda e: e.line)

    def _not_fatal(self, candidate: tuple[int, str | None, str, str, list[Frame], list[str]]) -> bool:
        """A traceback or error the server lived through, or that only reports a requested stop."""
        line, rank, exception = candidate[0], candidate[1], candidate[2]
        if line in self.ignored_tb_lines or exception in ("KeyboardInterrupt", "SystemExit"):
            return True
        if self.stop_line is not None and line > self.stop_line:
            return True
        points = self.doc.metrics["points"]
        if points and points[-1]["line"] > line:
            return True  # batch statistics after it: the server kept serving
        return any(
            m_line > line and m_name in PROGRESS and (m_rank == rank or rank is None)
            for m_line, _, m_rank, m_name, _ in self.milestones
        )

    def _phase_at(self, line: int, rank: str | None, frames: list[Frame]) -> tuple[str | None, str | None]:
        phase: str | None = None
        model = "main"
        relevant = [
            m for m in self.milestones if m[0] < line and (rank is None or m[2] in (rank, None) or not m[2])
        ]
        if not relevant:
            relevant = [m for m in self.milestones if m[0] < line]
        transitions = {
            "init_dist_begin": "init",
            "init_dist_end": "init",
            "weights_begin": "weight_loading",
            "weights_end": "kv_cache",
            "kv_cache_allocated": "kv_cache",
            "memory_pool_end": "kv_cache",
            "cuda_graph_begin": "cuda_graph_capture",
            "cuda_graph_end": "warmup",
            "capacity": "warmup",
            "http_up": "warmup",
            "engine_ready": "warmup",
            "ready": "serving",
        }
        for _, _, _, name, m_model in relevant:
            if name in transitions:
                phase = transitions[name]
                model = (
                    m_model if name == "cuda_graph_begin" else ("main" if name != "cuda_graph_end" else model)
                )
        if self.ready_line and line > self.ready_line:
            phase = "serving"
        if self.first_decode_line and line > self.first_decode_line and phase in (None, "warmup"):
            phase = "serving"
        funcs = " ".join(f"{f.file} {f.function}" for f in frames)
        if frames:
            if CAPTURE_FRAME.search(funcs):
                phase = "cuda_graph_capture"
            elif LOAD_FRAME.search(funcs) and phase in (None, "init", "weight_loading", "kv_cache"):
                phase = "weight_loading"
            elif KV_FRAME.search(funcs) and phase in (None, "init", "kv_cache", "weight_loading"):
                phase = "kv_cache"
            elif RUNTIME_FRAME.search(funcs) and phase in (None, "warmup", "serving"):
                phase = phase or "serving"
            if DRAFT_FRAME.search(funcs):
                model = "draft"
        if phase is None and self.milestones:
            phase = "init"
        return phase, (model if phase is not None or frames else None)

    def _phases(self) -> None:
        doc = self.doc
        lanes: dict[tuple[str | None, str], list[tuple[int, str | None, str]]] = {}
        for line, time, rank, name, model in self.milestones:
            lanes.setdefault((rank, model), []).append((line, time, name))
        spans = {
            "weight_loading": ("weights_begin", "weights_end"),
            "cuda_graph_capture": ("cuda_graph_begin", "cuda_graph_end"),
            "init": ("init_dist_begin", "init_dist_end"),
        }
        crash = doc.crash
        for (rank, model), events in lanes.items():
            names = [e[2] for e in events]
            for phase, (begin, end) in spans.items():
                if begin not in names:
                    continue
                b = events[names.index(begin)]
                e = next((ev for ev in events if ev[2] == end and ev[0] > b[0]), None)
                if e is None and phase == "init":
                    e = next((ev for ev in events if ev[0] > b[0]), None)
                crashed_here = crash is not None and e is None and crash["line"] > b[0]
                end_time = e[1] if e else (self._time_near(crash["line"]) if crashed_here and crash else None)
                detail = ""
                if e is None:
                    detail = "crashed" if crashed_here else "did not finish in the log"
                doc.phases.append(
                    {
                        "rank": rank,
                        "model": model,
                        "name": phase,
                        "start_line": b[0],
                        "end_line": e[0] if e else (crash["line"] if crashed_here and crash else None),
                        "start": b[1],
                        "end": end_time,
                        "seconds": _seconds(b[1], end_time),
                        "detail": detail,
                    }
                )
            kv = next((ev for ev in events if ev[2] == "kv_cache_allocated"), None)
            if kv:
                doc.phases.append(
                    {
                        "rank": rank,
                        "model": model,
                        "name": "kv_cache",
                        "start_line": kv[0],
                        "end_line": kv[0],
                        "start": kv[1],
                        "end": kv[1],
                        "seconds": 0.0,
                        "detail": "",
                    }
                )
        ready = next((m for m in self.milestones if m[3] == "ready"), None)
        if ready:
            last_line = self.last_metric_line or ready[0]
            doc.phases.append(
                {
                    "rank": None,
                    "model": "main",
                    "name": "serving",
                    "start_line": ready[0],
                    "end_line": last_line,
                    "start": ready[1],
                    "end": self.last_time,
                    "seconds": _seconds(ready[1], self.last_time),
                    "detail": "",
                }
            )
        doc.phases.sort(key=lambda p: p["start_line"])

    def _time_near(self, line: int) -> str | None:
        best = None
        for event in self.doc.timeline:
            if event.time:
                if event.line <= line:
                    best = event.time
                else:
                    return best or event.time
        return best

    def _outcome(self) -> None:
        doc = self.doc
        if doc.crash is not None:
            doc.outcome = "crashed"
        elif self.ready_line is not None and (self.first_decode_line or self.metric_total):
            doc.outcome = "serving"
        elif self.ready_line is not None:
            doc.outcome = "ready"
        elif self.first_decode_line is not None:
            doc.outcome = "serving"
        else:
            doc.outcome = "incomplete"


_METRIC_FIELDS = [
    (
        "gen_throughput",
        re.compile(r"gen throughput \(token/s\): ([\d.]+)|Avg generation throughput: ([\d.]+)"),
    ),
    (
        "input_throughput",
        re.compile(r"input throughput \(token/s\): ([\d.]+)|Avg prompt throughput: ([\d.]+)"),
    ),
    ("running", re.compile(r"#running-req: (\d+)|Running: (\d+) reqs")),
    ("queued", re.compile(r"#queue-req: (\d+)|Waiting: (\d+) reqs")),
    ("token_usage", re.compile(r"token usage: ([\d.]+)|KV cache usage: ([\d.]+)%")),
]


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    from datetime import datetime

    try:
        a = datetime.fromisoformat(start.replace("0000-", "2000-", 1))
        b = datetime.fromisoformat(end.replace("0000-", "2000-", 1))
    except ValueError:
        return None
    return round((b - a).total_seconds(), 3)


def _rank_sort_key(rank: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", rank)
    return (int(digits[-1]) if digits else -1, rank)

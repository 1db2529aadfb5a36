"""Matching the knowledge base against a parsed log: one pass for all signatures, then conditions on facts.

The parser scans every line once with all signature patterns in its multi-pattern engine and keeps the
hits; here each signature's any / all / sequence logic and conditions run on those hits. When no
signature explains a failure, the class is inferred from the document, so `other` is what remains when
nothing fits and `none` only when nothing failed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatchlab.core.document import ParsedLog, PatternHit
from dispatchlab.core.parser import ProgressCallback, parse_sources
from dispatchlab.core.reading import Source
from dispatchlab.core.signatures import KnowledgeBase, Signature, load_knowledge_base
from dispatchlab.core.versions import SpecifierSet


# ---------------------------------------------------------------- facts
def document_facts(doc: dict[str, Any]) -> dict[str, Any]:
    backends = doc.get("backends") or {}
    args = doc.get("server_args") or {}
    crash = doc.get("crash") or {}
    quantization = backends.get("quantization") or args.get("quantization")
    return {
        "arch": (doc.get("gpu") or {}).get("arch"),
        "server": doc.get("server") if doc.get("server") != "unknown" else (doc.get("engine") or None),
        "crash_phase": crash.get("phase"),
        "crash_model": crash.get("model"),
        "quantization": quantization if quantization not in (None, "None") else None,
        "outcome": doc.get("outcome"),
        "versions": {k: v for k, v in (doc.get("versions") or {}).items() if v},
        "backends": backends,
        "draft_backends": doc.get("draft_backends") or {},
        "server_args": args,
    }


def apply_fact_overrides(facts: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Example facts: `arch`, `server`, `crash_phase`, `crash_model`, `quantization`, `outcome`, a package
    name for its version, or dotted `backends.x` / `draft_backends.x` / `server_args.x` / `versions.x`."""
    merged = {
        **facts,
        "versions": dict(facts["versions"]),
        "backends": dict(facts["backends"]),
        "draft_backends": dict(facts["draft_backends"]),
        "server_args": dict(facts["server_args"]),
    }
    for key, value in overrides.items():
        if "." in key:
            table, name = key.split(".", 1)
            merged.setdefault(table, {})[name] = value
        elif key in ("sglang", "vllm", "flashinfer", "torch", "triton", "sgl_kernel", "cuda"):
            merged["versions"][key] = value
        else:
            merged[key] = value
    return merged


@dataclass
class ConditionResult:
    ok: bool
    satisfied: int
    unknown: int
    facts: dict[str, Any]


def check_conditions(signature: Signature, facts: dict[str, Any]) -> ConditionResult:
    satisfied = 0
    unknown = 0
    shown: dict[str, Any] = {}
    cond = signature.conditions

    def one(name: str, value: Any, allowed: list[Any], negate: bool = False) -> bool:
        nonlocal satisfied, unknown
        if value in (None, "", "unknown"):
            unknown += 1
            return True
        values = {str(a).lower() for a in allowed}
        inside = str(value).lower() in values
        if inside != negate:
            satisfied += 1
            shown[name] = value
            return True
        return False

    simple = {
        "arch_in": ("arch", False),
        "arch_not_in": ("arch", True),
        "server_in": ("server", False),
        "crash_phase_in": ("crash_phase", False),
        "quantization_in": ("quantization", False),
        "outcome_in": ("outcome", False),
    }
    for key, (fact, negate) in simple.items():
        if key in cond and not one(fact, facts.get(fact), cond[key], negate):
            return ConditionResult(False, satisfied, unknown, shown)
    if "crash_model" in cond and not one("crash_model", facts.get("crash_model"), [cond["crash_model"]]):
        return ConditionResult(False, satisfied, unknown, shown)
    for package, spec in cond.get("versions", {}).items():
        have = facts["versions"].get(package)
        if not have:
            unknown += 1
            continue
        inside = SpecifierSet(spec).contains(str(have))
        if inside is None:
            unknown += 1
        elif not inside:
            return ConditionResult(False, satisfied, unknown, shown)
        else:
            satisfied += 1
            shown[package] = have
    for table in ("backends", "draft_backends", "server_args"):
        for name, allowed in cond.get(table, {}).items():
            value = facts.get(table, {}).get(name)
            if not one(f"{table}.{name}", value, allowed):
                return ConditionResult(False, satisfied, unknown, shown)
    return ConditionResult(True, satisfied, unknown, shown)


# ---------------------------------------------------------------- line logic
def _sequence_lines(sig: Signature, hits: dict[int, list[PatternHit]]) -> list[int] | None:
    chains: list[list[int]] = [[h.line] for h in hits.get(sig.sequence_ids[0], [])]
    for pattern_id in sig.sequence_ids[1:]:
        next_lines = sorted(h.line for h in hits.get(pattern_id, []))
        extended = []
        for chain in chains:
            nxt = next((n for n in next_lines if chain[-1] < n <= chain[-1] + sig.within), None)
            if nxt is not None:
                extended.append([*chain, nxt])
        chains = extended
        if not chains:
            return None
    return chains[0] if chains else None


def line_evidence(sig: Signature, hits: dict[int, list[PatternHit]]) -> list[PatternHit] | None:
    """The hits that satisfy the signature's line logic, or None."""
    evidence: list[PatternHit] = []
    if sig.any_ids:
        found = [h for i in sig.any_ids for h in hits.get(i, [])]
        if not found:
            return None
        evidence.extend(found)
    for pattern_id in sig.all_ids:
        found = hits.get(pattern_id, [])
        if not found:
            return None
        evidence.extend(found[:3])
    if sig.sequence_ids:
        chain = _sequence_lines(sig, hits)
        if chain is None:
            return None
        wanted = set(chain)
        evidence.extend(h for i in sig.sequence_ids for h in hits.get(i, []) if h.line in wanted)
    return evidence


# ---------------------------------------------------------------- matching
def _crash_window(doc: dict[str, Any]) -> tuple[int, int] | None:
    crash = doc.get("crash")
    if not crash:
        return None
    start = crash["line"]
    end = start
    for tb in doc.get("tracebacks") or []:
        if tb["line"] == start or (
            tb.get("ranks") and crash.get("rank") in tb["ranks"] and abs(tb["line"] - start) < 400
        ):
            end = max(end, tb.get("end_line") or tb["line"])
    return start, max(end, start + 3)


def match_signatures(
    doc: dict[str, Any],
    hits: dict[int, list[PatternHit]],
    kb: KnowledgeBase,
    *,
    only: Sequence[Signature] | None = None,
    facts: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    facts = facts if facts is not None else document_facts(doc)
    window = _crash_window(doc)
    matches: list[tuple[tuple[float, ...], dict[str, Any]]] = []
    for sig in only if only is not None else kb.signatures:
        evidence = line_evidence(sig, hits)
        if evidence is None:
            continue
        result = check_conditions(sig, facts)
        if not result.ok:
            continue
        lines = sorted({h.line for h in evidence})
        at_crash = window is not None and any(window[0] <= n <= window[1] + 40 for n in lines)
        confidence = 0.6 + min(0.2, 0.05 * result.satisfied) - min(0.25, 0.08 * result.unknown)
        if at_crash:
            confidence += 0.15
        if len(sig.patterns) > 1 and len({h.line for h in evidence}) > 1:
            confidence += 0.05
        if sig.level == "warning":
            confidence = min(confidence, 0.5)
        confidence = round(max(0.05, min(0.99, confidence)), 2)
        variant = sig.fix_by_server.get(str(facts.get("server")))
        captured: dict[str, Any] = {}
        for hit in evidence:
            for key, value in hit.groups.items():
                captured.setdefault(key, value)
        captured.update(result.facts)
        match = {
            "id": sig.id,
            "title": sig.title,
            "failure_class": sig.failure_class,
            "confidence": confidence,
            "lines": lines[:50],
            "facts": captured,
            "fix": {
                "summary": variant.summary if variant else sig.fix_summary,
                "args": variant.args if variant else sig.fix_args,
                "env": variant.env if variant else sig.fix_env,
                "tried_and_failed": [f"{t.what}: {t.why}" for t in sig.tried_and_failed],
            },
            "decisions": [],
            "severity": sig.severity,
            "level": sig.level,
            "explanation": sig.explanation,
            "references": sig.references,
            "evidence": [
                {"line": h.line, "rank": h.rank, "text": h.text[:500]}
                for h in sorted(evidence, key=lambda h: h.line)[:12]
            ],
        }
        specificity = result.satisfied + len(sig.all_ids) + len(sig.sequence_ids)
        rank_key = (
            1.0 if sig.level == "failure" else 0.0,
            1.0 if at_crash else 0.0,
            confidence,
            float(specificity),
            -float(lines[0]),
        )
        matches.append((rank_key, match))
    matches.sort(key=lambda pair: pair[0], reverse=True)
    ordered = [m for _, m in matches]
    # reviewed precedence: a signature that explains another (a cause seen before the symptom) goes first
    superseding = {
        s.id: set(s.supersedes) for s in (only if only is not None else kb.signatures) if s.supersedes
    }
    for match in [m for m in ordered if m["id"] in superseding]:
        explained = superseding[str(match["id"])]
        targets = [i for i, m in enumerate(ordered) if m["id"] in explained]
        if targets and targets[0] < ordered.index(match):
            ordered.remove(match)
            ordered.insert(targets[0], match)
    return ordered


# ---------------------------------------------------------------- inference without a signature
_INFER = [
    (
        "oom",
        re.compile(
            r"out of memory|OutOfMemoryError|OOM|Not enough memory|No available memory for the cache|exit code: -9|oom-kill|\bKilled\b",
            re.I,
        ),
    ),
    ("nccl_error", re.compile(r"NCCL|ProcessGroupNCCL|DistBackendError|ncclInternalError|Gloo", re.I)),
    (
        "compile_error",
        re.compile(
            r"CompilationError|ptxas|PTXASError|nvcc.*fail|Ninja build failed|torch\._inductor|triton\.compiler|TritonError|InductorError|JIT compil",
            re.I,
        ),
    ),
    (
        "dependency_error",
        re.compile(
            r"ModuleNotFoundError|ImportError|undefined symbol|No module named|version mismatch|cannot import name|is installed with version|libcuda|\.so[.:\d]* cannot open",
            re.I,
        ),
    ),
    (
        "arch_unsupported_kernel",
        re.compile(
            r"no kernel image is available|not supported (?:on|for) (?:this|the current) (?:GPU|architecture|device)|[Uu]nsupported (?:GPU )?arch|requires (?:SM|sm_?)\d+|compute capability .* not supported|sm_\d+ is not compatible",
            re.I,
        ),
    ),
    (
        "cuda_error",
        re.compile(
            r"CUDA error|illegal memory access|device-side assert|misaligned address|unspecified launch failure|cudaError|CUBLAS_STATUS|CUDNN_STATUS|HIP error|hipError|Segmentation fault|SIGSEGV|exit code -11",
            re.I,
        ),
    ),
    ("timeout_hang", re.compile(r"[Ww]atchdog|timed? ?out|Timeout|hang|deadlock|heartbeat", re.I)),
    (
        "weight_loading_error",
        re.compile(
            r"size mismatch|load_weights|weight_loader|safetensors|checkpoint|state_dict|Missing key|Unexpected key|shape mismatch|must match the size",
            re.I,
        ),
    ),
    (
        "config_error",
        re.compile(
            r"invalid choice|not supported|unsupported|is not a valid|must be|should be|ValueError|NotImplementedError|Unknown|unrecognized arguments|AssertionError",
            re.I,
        ),
    ),
    ("garbage_output", re.compile(r"!!!!!!!!|NaN logits|nan logits")),
]


def infer_failure_class(doc: dict[str, Any]) -> str:
    crash = doc.get("crash")
    errors = doc.get("errors") or []
    texts: list[str] = []
    if crash:
        texts.append(f"{crash.get('exception') or ''}: {crash.get('message') or ''}")
        tb = next((t for t in doc.get("tracebacks") or [] if t["line"] == crash["line"]), None)
        if tb:
            texts.extend(f"{c['exception']}: {c['message']}" for c in tb.get("chain") or [])
            texts.append(" ".join(f"{f['file']} {f['function']}" for f in tb["frames"][-6:]))
    # the parser marks what it did not take as fatal (warnings, children exiting after a requested stop)
    fatal_errors = [
        e
        for e in errors
        if e.get("fatal", True) and e["kind"] not in ("sigquit", "init_failed", "exception", "error")
    ]
    texts.extend(e["text"] for e in fatal_errors[:20])
    if not crash and not fatal_errors:
        if any(e["kind"] == "garbage_output" for e in errors):
            return "garbage_output"
        if doc.get("outcome") in ("serving", "ready") or not errors:
            return "none"
        texts.extend(e["text"] for e in errors[:20])
        if not any(
            e["kind"] == "error" and re.search(r"[Ee]rror|[Ff]ail|[Ee]xception", e["text"]) for e in errors
        ):
            return "none"
    joined = "\n".join(texts)
    for failure_class, pattern in _INFER:
        if pattern.search(joined):
            if failure_class == "config_error" and crash and crash.get("phase") == "cuda_graph_capture":
                return "cuda_graph_capture_failure"
            return failure_class
    if crash and crash.get("phase") == "cuda_graph_capture":
        return "cuda_graph_capture_failure"
    return "other"


# ---------------------------------------------------------------- fingerprints
_APP_PACKAGES = re.compile(
    r"(?:^|/)((?:sglang|vllm|flashinfer|sgl_kernel|tensorrt_llm|deep_gemm|triton|aiter|lmdeploy)/[\w/]+\.py)$"
)
_NOISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x"),
    (re.compile(r"(?:/[\w.+-]+)+/?"), "/path"),
    (re.compile(r"\[[\d, ]+\]|\(\d+(?:, ?\d+)+\)|torch\.Size\([^)]*\)"), "<shape>"),
    (re.compile(r"\b(?:TP|DP|EP|PP|rank|Rank|pid|GPU|cuda:)\s*=?\s*\d+\b"), "<rank>"),
    (re.compile(r"\d+(?:\.\d+)?"), "#"),
    (re.compile(r"'[^']{40,}'|\"[^\"]{40,}\""), "'…'"),
    (re.compile(r"\s+"), " "),
]


def _normalise_text(text: str) -> str:
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return text.strip()[:240]


def _kernel_stem(name: str) -> str:
    return re.split(r"_t\d+x\d+", name)[0] if name.lower().startswith("bmm_") else re.sub(r"\d+", "#", name)


def fingerprint(doc: dict[str, Any], failure_class: str, best_id: str | None) -> str:
    crash = doc.get("crash")
    parts: list[str] = [failure_class]
    if crash:
        tb = next((t for t in doc.get("tracebacks") or [] if t["line"] == crash["line"]), None)
        parts.append(crash.get("exception") or "")
        parts.append(_normalise_text(crash.get("message") or ""))
        if tb:
            for frame in tb["frames"]:
                m = _APP_PACKAGES.search(frame["file"].replace("\\", "/"))
                if m:
                    parts.append(f"{m.group(1)}:{frame['function']}")
    elif best_id:
        parts.append(best_id)
    else:
        first = next((e for e in doc.get("errors") or [] if e["kind"] not in ("sigquit", "error")), None)
        if first:
            parts.append(_normalise_text(first["text"]))
    parts.extend(sorted({_kernel_stem(k) for k in doc.get("kernels") or []}))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- entry points
def finish_match(doc: dict[str, Any], hits: dict[int, list[PatternHit]], kb: KnowledgeBase) -> dict[str, Any]:
    matches = match_signatures(doc, hits, kb)
    failures = [m for m in matches if m["level"] == "failure"]
    inferred = infer_failure_class(doc)
    source = "signature" if failures else "inferred"
    failure_class = failures[0]["failure_class"] if failures else inferred
    if not failures and inferred == "other":
        # Something failed and nothing explains it: a known warning in the same log is the best lead
        # (warnings never make a clean log look failed: inferred would be "none" there).
        warning = next((m for m in matches if m["level"] == "warning"), None)
        if warning is not None:
            failure_class, source = warning["failure_class"], "warning"
    out = dict(doc)
    if failures and doc.get("crash") is None and doc.get("outcome") == "incomplete":
        _crash_from_signature(out, failures[0])
    out["matches"] = matches
    out["failure_class"] = failure_class
    out["failure_class_source"] = source
    out["fingerprint"] = fingerprint(doc, failure_class, failures[0]["id"] if failures else None)
    out["kb_digest"] = kb.digest
    return out


def _crash_from_signature(doc: dict[str, Any], match: dict[str, Any]) -> None:
    """A known fatal error in a log that never became ready: the server died there, even when the excerpt
    lacks the traceback's exception line (a pasted message, a `# Error:` note)."""
    if match["failure_class"] in ("garbage_output", "timeout_hang") or not match["evidence"]:
        return
    first = match["evidence"][0]
    started = [p for p in doc.get("phases") or [] if p["start_line"] <= first["line"]]
    doc["crash"] = {
        "line": first["line"],
        "phase": started[-1]["name"] if started else None,
        "exception": None,
        "message": first["text"],
        "rank": first.get("rank"),
        "ranks": [first["rank"]] if first.get("rank") else [],
        "model": None,
        "source": "signature",
    }
    doc["outcome"] = "crashed"


def analyze_parsed(parsed: ParsedLog, kb: KnowledgeBase) -> dict[str, Any]:
    return finish_match(parsed.to_dict(), parsed.pattern_hits, kb)


def analyze_sources(
    sources: Sequence[Source], *, progress: ProgressCallback | None = None, kb: KnowledgeBase | None = None
) -> dict[str, Any]:
    kb = kb or load_knowledge_base()
    parsed = parse_sources(sources, progress=progress, extra_patterns=kb.patterns)
    return analyze_parsed(parsed, kb)


def document_lines(doc: dict[str, Any]) -> list[tuple[int, str | None, str]]:
    """The lines a stored document still holds (crash, tracebacks, errors, timeline), for re-matching
    without the log."""
    lines: list[tuple[int, str | None, str]] = []
    for tb in doc.get("tracebacks") or []:
        lines.append((tb["line"], tb.get("rank"), "Traceback (most recent call last):"))
        for frame in tb["frames"]:
            lines.append(
                (
                    tb["line"],
                    tb.get("rank"),
                    f'  File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}',
                )
            )
        for item in tb.get("chain") or []:
            lines.append((tb["line"], tb.get("rank"), f"{item['exception']}: {item['message']}"))
        lines.append(
            (tb.get("end_line") or tb["line"], tb.get("rank"), f"{tb['exception']}: {tb['message']}")
        )
    for error in doc.get("errors") or []:
        lines.append((error["line"], error.get("rank"), error["text"]))
    for event in doc.get("timeline") or []:
        if event["kind"] in ("warning", "backend", "error"):
            lines.append((event["line"], event.get("rank"), event["detail"]))
    return lines


def match_parsed_document(doc: dict[str, Any], kb: KnowledgeBase | None = None) -> dict[str, Any]:
    kb = kb or load_knowledge_base()
    compiled = [re.compile(p) for p in kb.patterns]
    hits: dict[int, list[PatternHit]] = {}
    for number, rank, text in document_lines(doc):
        for index, pattern in enumerate(compiled):
            m = pattern.search(text)
            if m:
                bucket = hits.setdefault(index, [])
                if len(bucket) < 25:
                    bucket.append(
                        PatternHit(number, rank, text, {k: v for k, v in m.groupdict().items() if v})
                    )
    return finish_match(doc, hits, kb)

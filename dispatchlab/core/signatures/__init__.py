"""The knowledge base: reviewed signature files (data/<area>/<slug>.toml), validated on load.

Every error names the file and the field. The digest of all files identifies the knowledge-base version
that produced a match, so old matches stay explainable.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from dispatchlab.core.cache import cache_path, read_cached, write_cached
from dispatchlab.core.digest import sha256
from dispatchlab.core.parse.vocabulary import PHASE_ORDER
from dispatchlab.core.records import field, from_fields, record

DATA_DIR = Path(__file__).parent / "data"

FAILURE_CLASSES = (
    "arch_unsupported_kernel",
    "cuda_error",
    "cuda_graph_capture_failure",
    "oom",
    "nccl_error",
    "garbage_output",
    "dependency_error",
    "compile_error",
    "weight_loading_error",
    "config_error",
    "timeout_hang",
    "none",
    "other",
)
SEVERITIES = ("critical", "error", "warning", "info")
LEVELS = ("failure", "warning", "wrapper")
PHASES = PHASE_ORDER
VERSION_KEYS = ("sglang", "vllm", "flashinfer", "torch", "triton", "sgl_kernel", "cuda")
BACKEND_KEYS = (
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "moe_runner_backend",
    "moe_a2a_backend",
    "fp4_gemm_backend",
    "fp8_gemm_backend",
    "sampling_backend",
    "quantization",
    "kv_cache_dtype",
    "grammar_backend",
    "mm_attention_backend",
    "dsa_prefill_backend",
    "dsa_decode_backend",
    "speculative_algorithm",
)
LIST_CONDITIONS = ("arch_in", "arch_not_in", "server_in", "crash_phase_in", "quantization_in", "outcome_in")
TOP_FIELDS = {
    "supersedes",
    "id",
    "title",
    "failure_class",
    "severity",
    "level",
    "explanation",
    "references",
    "match",
    "conditions",
    "fix",
    "tried_and_failed",
    "example",
}


class SignatureError(ValueError):
    def __init__(self, path: Path | str, field_name: str, problem: str) -> None:
        self.path = str(path)
        self.field_name = field_name
        super().__init__(f"{path}: {field_name}: {problem}")


@record(frozen=True)
class Example:
    expect: str  # "match" | "no_match"
    log: str
    facts: dict[str, Any]


@record(frozen=True)
class FixVariant:
    """The fix in another server's flags (a FlashInfer kernel fails the same way under SGLang and vLLM)."""

    summary: str
    args: dict[str, Any]
    env: dict[str, str]


@record(frozen=True)
class TriedAndFailed:
    what: str
    why: str


@record
class Signature:
    id: str
    path: str
    title: str
    failure_class: str
    severity: str
    level: str
    explanation: str
    references: list[str]
    any_patterns: list[str]
    all_patterns: list[str]
    sequence: list[str]
    within: int
    conditions: dict[str, Any]
    fix_summary: str
    fix_args: dict[str, Any]
    fix_env: dict[str, Any]
    fix_by_server: dict[str, FixVariant]
    tried_and_failed: list[TriedAndFailed]
    examples: list[Example]
    supersedes: list[str] = field(default_factory=list)  # ids this one explains better when both match
    # indexes into KnowledgeBase.patterns, filled by the knowledge base
    any_ids: list[int] = field(default_factory=list)
    all_ids: list[int] = field(default_factory=list)
    sequence_ids: list[int] = field(default_factory=list)

    @property
    def patterns(self) -> list[str]:
        return [*self.any_patterns, *self.all_patterns, *self.sequence]


@record
class KnowledgeBase:
    signatures: list[Signature]
    patterns: list[str]
    digest: str

    @classmethod
    def from_signatures(cls, signatures: list[Signature], digest: str) -> KnowledgeBase:
        patterns: list[str] = []
        index: dict[str, int] = {}

        def ids(items: list[str]) -> list[int]:
            out = []
            for pattern in items:
                if pattern not in index:
                    index[pattern] = len(patterns)
                    patterns.append(pattern)
                out.append(index[pattern])
            return out

        for signature in signatures:
            signature.any_ids = ids(signature.any_patterns)
            signature.all_ids = ids(signature.all_patterns)
            signature.sequence_ids = ids(signature.sequence)
        return cls(signatures, patterns, digest)


def _require(
    data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path, default: Any = ...
) -> Any:
    if key not in data:
        if default is ...:
            raise SignatureError(path, key, "missing")
        return default
    value = data[key]
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SignatureError(path, key, f"must be {name}, got {type(value).__name__}")
    return value


def _patterns(match: dict[str, Any], key: str, path: Path) -> list[str]:
    items = _require(match, key, list, path, [])
    for i, pattern in enumerate(items):
        if not isinstance(pattern, str) or not pattern:
            raise SignatureError(path, f"match.{key}[{i}]", "must be a non-empty string")
        try:
            re.compile(pattern)
        except re.error as error:
            raise SignatureError(path, f"match.{key}[{i}]", f"invalid regex: {error}") from None
    return list(items)


def _conditions(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    from dispatchlab.core.versions import InvalidSpecifier, SpecifierSet  # a rebuild of the cache only

    conditions: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"conditions.{key}"
        if key in LIST_CONDITIONS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise SignatureError(path, where, "must be a list of strings")
            if key == "crash_phase_in":
                for phase in value:
                    if phase not in PHASES:
                        raise SignatureError(
                            path, where, f"unknown phase {phase!r} (one of {', '.join(PHASES)})"
                        )
            conditions[key] = value
        elif key == "crash_model":
            if value not in ("main", "draft"):
                raise SignatureError(path, where, "must be 'main' or 'draft'")
            conditions[key] = value
        elif key == "versions":
            if not isinstance(value, dict):
                raise SignatureError(path, where, "must be a table")
            for package, spec in value.items():
                if package not in VERSION_KEYS:
                    raise SignatureError(
                        path, f"{where}.{package}", f"unknown package (one of {', '.join(VERSION_KEYS)})"
                    )
                try:
                    SpecifierSet(spec)
                except InvalidSpecifier:
                    raise SignatureError(
                        path, f"{where}.{package}", f"invalid PEP 440 specifier {spec!r}"
                    ) from None
            conditions[key] = dict(value)
        elif key in ("backends", "draft_backends", "server_args"):
            if not isinstance(value, dict):
                raise SignatureError(path, where, "must be a table")
            table: dict[str, list[Any]] = {}
            for name, allowed in value.items():
                if key != "server_args" and name not in BACKEND_KEYS:
                    raise SignatureError(
                        path, f"{where}.{name}", f"unknown backend key (one of {', '.join(BACKEND_KEYS)})"
                    )
                table[name] = allowed if isinstance(allowed, list) else [allowed]
            conditions[key] = table
        else:
            raise SignatureError(path, where, "unknown condition")
    return conditions


def _read_toml(path: Path) -> dict[str, Any]:
    import tomllib  # only when the cached knowledge base is stale

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise SignatureError(path, "(file)", f"not valid TOML: {error}") from None
    unknown = set(data) - TOP_FIELDS
    if unknown:
        raise SignatureError(path, sorted(unknown)[0], "unknown field")
    return data


def _one_of(data: dict[str, Any], key: str, path: Path, allowed: Any, default: Any = None) -> str:
    value = _require(data, key, str, path, default)
    if value not in allowed:
        raise SignatureError(path, key, f"one of {', '.join(allowed)}")
    return str(value)


def _match_patterns(data: dict[str, Any], path: Path) -> tuple[list[str], list[str], list[str], int]:
    match = _require(data, "match", dict, path)
    unknown = set(match) - {"any", "all", "sequence", "within"}
    if unknown:
        raise SignatureError(path, f"match.{sorted(unknown)[0]}", "unknown field")
    found = _patterns(match, "any", path), _patterns(match, "all", path), _patterns(match, "sequence", path)
    if not any(found):
        raise SignatureError(path, "match", "needs at least one of any / all / sequence")
    return *found, _require(match, "within", int, path, 200)


def _fix_variants(fix: dict[str, Any], summary: str, path: Path) -> dict[str, FixVariant]:
    by_server: dict[str, FixVariant] = {}
    for server, variant in _require(fix, "by_server", dict, path, {}).items():
        where = f"fix.by_server.{server}"
        if server not in ("sglang", "vllm") or not isinstance(variant, dict):
            raise SignatureError(path, where, "a table per server: sglang or vllm")
        if set(variant) - {"summary", "args", "env"}:
            raise SignatureError(path, where, "holds summary, args and env only")
        args = variant.get("args", {})
        if not isinstance(args, dict) or not all(str(k).startswith("-") for k in args):
            raise SignatureError(path, f"{where}.args", "a table of flags starting with --")
        env = {k: str(v) for k, v in variant.get("env", {}).items()}
        by_server[server] = FixVariant(str(variant.get("summary", summary)), dict(args), env)
    return by_server


def _fix(
    data: dict[str, Any], path: Path
) -> tuple[str, dict[str, Any], dict[str, str], dict[str, FixVariant]]:
    fix = _require(data, "fix", dict, path)
    unknown = set(fix) - {"summary", "args", "env", "by_server"}
    if unknown:
        raise SignatureError(path, f"fix.{sorted(unknown)[0]}", "unknown field")
    summary = _require(fix, "summary", str, path)
    args = _require(fix, "args", dict, path, {})
    for name in args:
        if not str(name).startswith("-"):
            raise SignatureError(path, f"fix.args.{name}", "flags start with --")
    env = {k: str(v) for k, v in _require(fix, "env", dict, path, {}).items()}
    return summary, dict(args), env, _fix_variants(fix, summary, path)


def _tried(data: dict[str, Any], path: Path) -> list[TriedAndFailed]:
    tried: list[TriedAndFailed] = []
    for i, item in enumerate(_require(data, "tried_and_failed", list, path, [])):
        if not (
            isinstance(item, dict) and isinstance(item.get("what"), str) and isinstance(item.get("why"), str)
        ):
            raise SignatureError(path, f"tried_and_failed[{i}]", "needs `what` and `why` strings")
        tried.append(TriedAndFailed(item["what"], item["why"]))
    return tried


def _examples(data: dict[str, Any], path: Path) -> list[Example]:
    examples: list[Example] = []
    for i, item in enumerate(_require(data, "example", list, path, [])):
        where = f"example[{i}]"
        if not isinstance(item, dict):
            raise SignatureError(path, where, "must be a table")
        expect = item.get("expect")
        if expect not in ("match", "no_match"):
            raise SignatureError(path, f"{where}.expect", "must be 'match' or 'no_match'")
        log = item.get("log")
        if not isinstance(log, str) or not log.strip():
            raise SignatureError(path, f"{where}.log", "must be a non-empty string")
        facts = item.get("facts", {})
        if not isinstance(facts, dict):
            raise SignatureError(path, f"{where}.facts", "must be a table")
        examples.append(Example(expect, log, facts))
    return examples


def load_signature(path: Path) -> Signature:
    """One signature file, validated; SignatureError names the file and the field."""
    data = _read_toml(path)
    sig_id = _require(data, "id", str, path)
    if sig_id != path.stem:
        raise SignatureError(path, "id", f"{sig_id!r} must equal the file name {path.stem!r}")
    failure_class = _require(data, "failure_class", str, path)
    if failure_class not in FAILURE_CLASSES or failure_class == "none":
        raise SignatureError(
            path, "failure_class", f"{failure_class!r} is not a failure class of the taxonomy"
        )
    any_patterns, all_patterns, sequence, within = _match_patterns(data, path)
    fix_summary, fix_args, fix_env, by_server = _fix(data, path)
    supersedes = _require(data, "supersedes", list, path, [])
    if not all(isinstance(item, str) for item in supersedes):
        raise SignatureError(path, "supersedes", "must be a list of signature ids")
    return Signature(
        id=sig_id,
        path=str(path),
        title=_require(data, "title", str, path),
        failure_class=failure_class,
        severity=_one_of(data, "severity", path, SEVERITIES, "error"),
        level=_one_of(data, "level", path, LEVELS, "failure"),
        explanation=_require(data, "explanation", str, path),
        references=[str(r) for r in _require(data, "references", list, path, [])],
        any_patterns=any_patterns,
        all_patterns=all_patterns,
        sequence=sequence,
        within=within,
        conditions=_conditions(_require(data, "conditions", dict, path, {}), path),
        fix_summary=fix_summary,
        fix_args=fix_args,
        fix_env=fix_env,
        fix_by_server=by_server,
        tried_and_failed=_tried(data, path),
        examples=_examples(data, path),
        supersedes=list(supersedes),
    )


def signature_files(directory: Path = DATA_DIR) -> list[Path]:
    return sorted(directory.rglob("*.toml"))


def load_knowledge_base(directory: Path | None = None) -> KnowledgeBase:
    """Load and validate every signature; raises SignatureError naming the file and field."""
    return _load_cached(str(directory or DATA_DIR), _tree_stamp(str(directory or DATA_DIR)))


# bump when what the cache holds changes shape; this module's own stamp is in the key too, so an edit to the
# loader's validation or defaults also makes the cached knowledge base stale (and the Python version: marshal
# data is only promised to another run of the same one)
_CACHE_FORMAT = 3


def _tree_stamp(directory: str) -> tuple[tuple[str, int, int, int], ...]:
    """Every signature file's path, size, mtime and ctime, and this module's: what a cached load was made
    from (the ctime changes with any write, even one that keeps size and mtime). os.scandir, not
    Path.rglob: this runs on every command."""
    found: list[tuple[str, int, int, int]] = []
    pending = [directory]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir():
                    pending.append(entry.path)
                elif entry.name.endswith(".toml"):
                    found.append(_stamp(entry.path, entry.stat()))
    return (*sorted(found), _stamp(__file__, os.stat(__file__)))


def _stamp(path: str, stat: os.stat_result) -> tuple[str, int, int, int]:
    return path, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


@lru_cache(maxsize=4)
def _load_cached(directory: str, stamp: tuple[tuple[str, int, int, int], ...]) -> KnowledgeBase:
    # a validated knowledge base is kept on disk too: a CLI call then starts without parsing ~100 TOML files;
    # as marshal data (each record's fields), which loads several times faster than a pickle of the objects
    path = cache_path("kb", (_CACHE_FORMAT, sys.implementation.cache_tag, directory, stamp), ".marshal")
    stored = read_cached(path)
    if stored is not None:
        try:
            return _from_plain(marshal.loads(stored))
        except Exception:  # written by another version of this code: rebuild it
            pass
    kb = _load(directory)
    # a value marshal cannot hold (a TOML date) leaves no cache: the files are then read every time
    with contextlib.suppress(ValueError):
        write_cached(path, marshal.dumps(_to_plain(kb)))
    return kb


def _to_plain(kb: KnowledgeBase) -> dict[str, Any]:
    def plain(signature: Signature) -> dict[str, Any]:
        fields = vars(signature).copy()
        fields["fix_by_server"] = {k: vars(v) for k, v in signature.fix_by_server.items()}
        fields["tried_and_failed"] = [vars(t) for t in signature.tried_and_failed]
        fields["examples"] = [vars(e) for e in signature.examples]
        return fields

    return {"digest": kb.digest, "patterns": kb.patterns, "signatures": [plain(s) for s in kb.signatures]}


def _from_plain(data: dict[str, Any]) -> KnowledgeBase:
    signatures = []
    for fields in data["signatures"]:
        fields["fix_by_server"] = {k: from_fields(FixVariant, v) for k, v in fields["fix_by_server"].items()}
        fields["tried_and_failed"] = [from_fields(TriedAndFailed, t) for t in fields["tried_and_failed"]]
        fields["examples"] = [from_fields(Example, e) for e in fields["examples"]]
        signatures.append(from_fields(Signature, fields))
    return KnowledgeBase(signatures, data["patterns"], data["digest"])


def _load(directory: str) -> KnowledgeBase:
    files = signature_files(Path(directory))
    digest = sha256()
    signatures: list[Signature] = []
    seen: dict[str, str] = {}
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
        signature = load_signature(path)
        if signature.id in seen:
            raise SignatureError(path, "id", f"duplicate of {seen[signature.id]}")
        seen[signature.id] = str(path)
        signatures.append(signature)
    return KnowledgeBase.from_signatures(signatures, digest.hexdigest()[:16])

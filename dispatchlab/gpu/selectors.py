"""Read-only queries of the GPU side, scoped to what the user may see, and the compatibility matrix.

Hosts are global (a machine serves every project); confirm runs belong to a report's project; probe
runs belong to the project that asked for them, or to none when a host ran them on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.urls import reverse

from dispatchlab.core.launch import REPRO_PREFIX
from dispatchlab.core.signatures import KnowledgeBase, Signature, load_knowledge_base
from dispatchlab.gpu.models import ConfirmOutput, ConfirmRun, GpuHost, ProbeRun
from dispatchlab.reports.selectors import projects_of

User = AbstractBaseUser | AnonymousUser

# ---------------------------------------------------------------- scoping


def confirms_visible_to(user: User) -> QuerySet[ConfirmRun]:
    if not user.is_authenticated:
        return ConfirmRun.objects.none()
    return ConfirmRun.objects.filter(project__in=projects_of(user))


def probe_runs_visible_to(user: User) -> QuerySet[ProbeRun]:
    """Probe runs of the user's projects, and those no project asked for."""
    if not user.is_authenticated:
        return ProbeRun.objects.none()
    return ProbeRun.objects.filter(Q(project__in=projects_of(user)) | Q(project__isnull=True))


@dataclass
class HostRow:
    host: GpuHost
    probe: ProbeRun | None  # the latest finished run of kernel probes (or the one asked for by id)
    pending: ProbeRun | None  # a probe run asked for after the latest finished one, still waiting
    # the latest finished run with an all-reduce result (or the one asked for)
    allreduce: ProbeRun | None = None


def hosts_with_probes(user: User, *, probe_id: int | None = None) -> list[HostRow]:
    """Every host with its latest finished probe runs (of kernel probes, of the all-reduce) and any newer
    one still queued: two queries.

    `probe_id` shows that (visible) probe run instead of its host's latest one, so a link to old
    evidence opens it."""
    runs = probe_runs_visible_to(user)
    done = runs.filter(host=OuterRef("pk"), status=ProbeRun.Status.DONE).order_by("-finished_at", "-id")
    latest_queued = runs.filter(host=OuterRef("pk"), status=ProbeRun.Status.QUEUED).order_by(
        "-created_at", "-id"
    )
    hosts = list(
        GpuHost.objects.annotate(
            done_id=Subquery(done.values("id")[:1]),
            # an all-reduce is asked for on its own: the run before it still holds the kernel probes
            kernels_id=Subquery(done.exclude(results__icontains=ALLREDUCE_TEXT).values("id")[:1]),
            allreduce_id=Subquery(done.filter(results__icontains=ALLREDUCE_TEXT).values("id")[:1]),
            queued_id=Subquery(latest_queued.values("id")[:1]),
        ).order_by("name")
    )
    keys = ("done_id", "kernels_id", "allreduce_id", "queued_id")
    wanted = {getattr(h, key) for h in hosts for key in keys} - {None}
    if probe_id is not None:
        wanted.add(probe_id)
    found = {run.id: run for run in runs.filter(id__in=wanted)} if wanted else {}
    chosen = found.get(probe_id) if probe_id is not None else None
    rows = []
    for host in hosts:
        latest = found.get(host.done_id)  # type: ignore[attr-defined]
        probe = latest
        if latest is not None and _allreduce_only(latest):
            probe = found.get(host.kernels_id)  # type: ignore[attr-defined]
        allreduce = found.get(host.allreduce_id)  # type: ignore[attr-defined]
        if chosen is not None and chosen.host_id == host.id:
            if not _allreduce_only(chosen):
                probe = chosen
            if allreduce_result(chosen.results) is not None:
                allreduce = chosen
        if allreduce is not None and allreduce_result(allreduce.results) is None:
            allreduce = None
        pending = found.get(host.queued_id)  # type: ignore[attr-defined]
        if pending is not None and latest is not None and pending.created_at < latest.created_at:
            pending = None
        rows.append(HostRow(host=host, probe=probe, pending=pending, allreduce=allreduce))
    return rows


def _allreduce_only(run: ProbeRun) -> bool:
    return allreduce_result(run.results) is not None and not kernel_results(run.results)


def newest_allreduce(user: User, *, arch: str) -> ProbeRun | None:
    """The newest finished probe run the user may see, of a host of `arch`, whose all-reduce was tried:
    one skipped (a host of one GPU) or lacking a package says nothing about any link."""
    if not arch:
        return None
    runs = (
        probe_runs_visible_to(user)
        .filter(status=ProbeRun.Status.DONE, arch=arch, results__icontains=ALLREDUCE_TEXT)
        .select_related("host")
        .order_by("-finished_at", "-id")
    )
    for run in runs[:20]:
        result = allreduce_result(run.results)
        if result is not None and str(result.get("status") or "").upper() not in NOT_TRIED:
            return run
    return None


def confirm_output_tail(
    confirm: ConfirmRun, *, lines: int = 200, max_chars: int = 100_000
) -> tuple[str, bool]:
    """The last `lines` lines of what the launch printed so far, and whether earlier output was left
    out. Reads pieces from the end, so a long run costs what a short one does."""
    pieces: list[str] = []
    newlines = size = 0
    more = False
    texts = (
        ConfirmOutput.objects.filter(confirm=confirm).order_by("-seq").values_list("text", flat=True)
    ).iterator(chunk_size=20)
    for text in texts:
        if newlines > lines or size > max_chars:
            more = True
            break
        pieces.append(text)
        newlines += text.count("\n")
        size += len(text)
    split = "".join(reversed(pieces)).splitlines()
    if len(split) > lines:
        split, more = split[-lines:], True
    tail = "\n".join(split)
    if len(tail) > max_chars:
        tail, more = tail[-max_chars:], True
    return tail, more


# ---------------------------------------------------------------- probe results

# The multi-GPU NCCL probe: a measurement of a host's links, not of a kernel on an arch.
ALLREDUCE = "allreduce"
# How every stored all-reduce result reads in the JSON text of `ProbeRun.results` (SQLite keeps
# json.dumps' text, PostgreSQL renders jsonb the same way): a filter a database can apply, which
# `allreduce_result` then confirms.
ALLREDUCE_TEXT = '"name": "allreduce"'


def is_allreduce(probe: Any) -> bool:
    return isinstance(probe, dict) and probe.get("name") == ALLREDUCE


def allreduce_result(results: Any) -> dict[str, Any] | None:
    """The (last) all-reduce result among a run's probe results, or None."""
    found = [p for p in results if is_allreduce(p)] if isinstance(results, list) else []
    return found[-1] if found else None


def kernel_results(results: Any) -> list[dict[str, Any]]:
    """A run's single-GPU kernel probes: everything but the all-reduce."""
    if not isinstance(results, list):
        return []
    return [p for p in results if isinstance(p, dict) and not is_allreduce(p)]


PROBE_FAILS = frozenset(
    {
        "UNSUPPORTED_ARCH",
        "RUNTIME_ERROR",
        "COMPILE_ERROR",
        "INCORRECT_NUMERICAL",
        "INCORRECT_SHAPE",
        "INCORRECT_DTYPE",
    }
)
PROBE_WORKS = frozenset({"PASSED", "OK", "CORRECT"})
NOT_TRIED = frozenset({"SKIPPED", "NOT_INSTALLED"})


def probe_verdict(probe: dict[str, Any]) -> str:
    """ "works", "fails", or "" when the probe says nothing about the kernel on this arch (skipped,
    timed out, a package missing on the host)."""
    status = str(probe.get("status") or "").upper()
    if status in PROBE_FAILS:
        return "fails"
    if status in PROBE_WORKS:
        return "works" if probe.get("runs", True) else "fails"
    if status:
        return ""
    if probe.get("runs") is True and not probe.get("error"):
        return "works"
    if probe.get("runs") is False and probe.get("error"):
        return "fails"
    return ""


# ---------------------------------------------------------------- compatibility matrix

BASE_ARCHES = ("sm_80", "sm_89", "sm_90", "sm_100", "sm_120")
# Backend keys of a document (or launch flags) and the matrix row group each belongs to. The draft's
# keys (`draft_moe_runner_backend`) fall in the same group: a kernel runs or not whichever model calls it.
COMPONENT_OF_KEY = {
    "moe_runner_backend": "moe",
    "attention_backend": "attention",
    "prefill_attention_backend": "attention",
    "decode_attention_backend": "attention",
    "mm_attention_backend": "attention",
    "dsa_prefill_backend": "attention",
    "dsa_decode_backend": "attention",
    "fp4_gemm_backend": "fp4 gemm",
    "fp8_gemm_backend": "fp8 gemm",
    "moe_a2a_backend": "moe all-to-all",
    "sampling_backend": "sampling",
}
COMPONENT_ORDER = (
    "moe",
    "attention",
    "fp4 gemm",
    "fp8 gemm",
    "gemm",
    "moe all-to-all",
    "sampling",
    "memory",
    "jit",
)
# Rows shown even before any evidence, so "untested" is visible as such.
DEFAULT_ROWS = {
    "moe": ("flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl", "triton"),
    "attention": ("fa3", "fa4", "flashinfer", "triton", "trtllm_mha", "trtllm_mla"),
}
NOT_A_BACKEND = frozenset({"", "auto", "none", "null", "default"})
_ARCH = re.compile(r"(?i)^sm_?(\d{2,3})[a-z]?$")


def arch_name(text: str) -> str | None:
    """ "sm120", "SM_120", "sm_120a" -> "sm_120"."""
    found = _ARCH.match(text.strip())
    return f"sm_{found.group(1)}" if found else None


def _arch_key(arch: str) -> tuple[int, str]:
    digits = re.sub(r"\D", "", arch)
    return (int(digits) if digits else 10_000, arch)


def _key_component(key: str) -> str | None:
    return COMPONENT_OF_KEY.get(key.removeprefix("draft_"))


def _probe_component(probe: dict[str, Any]) -> str:
    component = str(probe.get("component") or "").strip().lower()
    name = str(probe.get("name") or "").lower()
    if not component:
        component = name.split("_", 1)[0] or "other"
    if component == "gemm":
        for dtype in ("fp4", "fp8"):
            if dtype in name:
                return f"{dtype} gemm"
    return component


@dataclass
class Evidence:
    verdict: str  # "works" | "fails"
    source: str  # "kb" | "confirm" (the server ran) | "kernel" (a stand-in ran) | "probe"
    label: str  # what it is, short: "confirm 12 (fixed)"
    detail: str  # why, for the hover
    url: str
    when: datetime | None = None

    @property
    def real(self) -> bool:
        return self.source != "kb"


@dataclass
class Cell:
    arch: str
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def deciding(self) -> Evidence | None:
        """A run on a GPU beats the knowledge base; among runs, the newest one decides."""
        real = sorted(
            (e for e in self.evidence if e.real),
            key=lambda e: e.when.timestamp() if e.when else 0.0,
            reverse=True,
        )
        if real:
            return real[0]
        return next(iter(self.evidence), None)

    @property
    def verdict(self) -> str:
        deciding = self.deciding
        return deciding.verdict if deciding else "untested"

    @property
    def source(self) -> str:
        deciding = self.deciding
        return deciding.source if deciding else ""

    @property
    def title(self) -> str:
        if not self.evidence:
            return f"untested on {self.arch}: no run and no signature names it"
        lines = [f"{e.verdict}: {e.label}" + (f" — {e.detail}" if e.detail else "") for e in self.evidence]
        return "\n".join(lines[:8]) + (f"\n… {len(lines) - 8} more" if len(lines) > 8 else "")


@dataclass
class Row:
    component: str
    backend: str
    cells: list[Cell]

    @property
    def tested(self) -> bool:
        return any(cell.evidence for cell in self.cells)


@dataclass
class KbCitation:
    id: str
    title: str
    failure_class: str
    statements: list[str]


@dataclass
class CompatMatrix:
    arches: list[str]
    rows: list[Row]
    signatures: list[KbCitation]

    def groups(self) -> list[tuple[str, list[Row]]]:
        out: dict[str, list[Row]] = {}
        for row in self.rows:
            out.setdefault(row.component, []).append(row)
        return list(out.items())

    def cell(self, component: str, backend: str, arch: str) -> Cell | None:
        for row in self.rows:
            if row.component == component and row.backend == backend:
                return next((c for c in row.cells if c.arch == arch), None)
        return None


@dataclass
class _Claim:
    component: str
    backend: str
    arches: set[str] | None  # None: every arch except `except_arches`
    except_arches: set[str]
    evidence: Evidence


def _tried_and_failed_flag(what: str) -> tuple[str, str, str | None] | None:
    """ "--moe-runner-backend flashinfer_trtllm [on sm_120]" -> (key, value, arch). Anything longer
    (a qualifier such as "for the main model only") is a dead end of a situation, not of a kernel."""
    tokens = what.split()
    if len(tokens) == 2:
        arch = None
    elif len(tokens) == 4 and tokens[2] == "on":
        arch = arch_name(tokens[3])
        if arch is None:
            return None
    else:
        return None
    if not tokens[0].startswith("--"):
        return None
    return tokens[0].lstrip("-").replace("-", "_"), tokens[1], arch


_FAILURE_WORDS = re.compile(
    r"(?i)\b(?:crash\w*|fail\w*|error\w*|exception|garbage|refus\w*|wrong|nan|unsupported|illegal|abort\w*|"
    r"hang\w*|out of memory|oom|not (?:built|supported|compiled)|no kernel)\b|!!!!"
)
_ARCH_MENTION = re.compile(r"(?i)\bsm_?\d{2,3}[a-z]?\b")


def _reports_a_failure(why: str) -> bool:
    """Whether a dead end's note says the flag failed (crashed, errored, answered garbage), rather than
    that it was slow or did not change what it was meant to change."""
    return bool(_FAILURE_WORDS.search(why))


def _arch_of_note(why: str) -> str | None:
    """The arch a dead end's note was seen on: the first it names ("Measured on RTX PRO 6000 (sm_120):
    crashes, ... built for SM100 only" was seen on sm_120; SM100 is where the kernel would run)."""
    found = _ARCH_MENTION.search(why)
    return arch_name(found.group(0)) if found else None


def _kb_claims(signatures: Iterable[Signature]) -> tuple[list[_Claim], dict[str, KbCitation]]:
    """What the knowledge base says fails where: a signature that names an arch (its conditions, or a
    dead end "flag value on sm_NNN") and a backend (its backend conditions, or a tried-and-failed
    backend flag) says that backend fails there."""
    claims: list[_Claim] = []
    cited: dict[str, KbCitation] = {}
    for signature in signatures:
        conditions = signature.conditions
        arch_in = {a for a in conditions.get("arch_in") or [] if arch_name(a)}
        arch_not = {a for a in conditions.get("arch_not_in") or [] if arch_name(a)}
        named: list[tuple[str, str, set[str] | None, str]] = []  # key, value, arches it names, why
        for table in ("backends", "draft_backends", "server_args"):
            for key, values in (conditions.get(table) or {}).items():
                for value in values:
                    model = "the draft's " if table == "draft_backends" else ""
                    named.append((key, str(value), None, f"{model}{key} = {value} in its conditions"))
        for dead_end in signature.tried_and_failed:
            parsed = _tried_and_failed_flag(dead_end.what)
            if parsed is None:
                continue
            key, value, arch = parsed
            if arch is None:
                # The note says where it failed, if anywhere: a slow first JIT build is not a failure,
                # and what one arch showed says nothing of the others.
                if not _reports_a_failure(dead_end.why):
                    continue
                arch = _arch_of_note(dead_end.why)
            named_arches = {arch} if arch else None
            named.append((key, value, named_arches, f"tried and failed: {dead_end.why}"))
        for key, value, named_arches, why in named:
            component = _key_component(key)
            if component is None or value.lower() in NOT_A_BACKEND:
                continue
            if named_arches:
                arches: set[str] | None = set(named_arches)
            elif arch_in:
                arches = arch_in - arch_not
            elif arch_not:
                arches = None
            else:
                continue
            url = reverse("front:compat") + f"#sig-{signature.id}"
            evidence = Evidence("fails", "kb", f"signature {signature.id}", f"{signature.title} ({why})", url)
            claims.append(_Claim(component, value, arches, arch_not if arches is None else set(), evidence))
            where = (
                ", ".join(sorted(arches, key=_arch_key))
                if arches is not None
                else "every arch but " + ", ".join(sorted(arch_not, key=_arch_key))
            )
            citation = cited.setdefault(
                signature.id,
                KbCitation(signature.id, signature.title, signature.failure_class, []),
            )
            citation.statements.append(f"{component} {value} fails on {where}: {why}")
    return claims, cited


def _confirm_claims(user: User) -> list[_Claim]:
    """Finished confirm runs: a fixed launch's backends work on its arch; when it still fails or
    serves garbage, the backends the fix changed (the ones under test) fail there. One query."""
    rows = (
        confirms_visible_to(user)
        .filter(
            status__in=[ConfirmRun.Status.FIXED, ConfirmRun.Status.STILL_FAILS, ConfirmRun.Status.GARBAGE],
            result_report__isnull=False,
        )
        .values(
            "id",
            "status",
            "arch",
            "error",
            "finished_at",
            "host_name",
            "launcher",
            "result_report__arch",
            "result_report__backend_values",
            "report__backend_values",
        )
    )
    claims = []
    for row in rows:
        arch = row["result_report__arch"] or row["arch"]
        if not arch:
            continue
        after = row["result_report__backend_values"] or {}
        before = row["report__backend_values"] or {}
        fixed = row["status"] == ConfirmRun.Status.FIXED
        status = ConfirmRun.Status(row["status"]).label
        url = reverse("front:confirm", args=[row["id"]])
        # A stand-in ran the kernel path, not the server: kernel evidence, never a server confirmation.
        stand_in = str(row["launcher"]).startswith(REPRO_PREFIX)
        source = "kernel" if stand_in else "confirm"
        run = (
            f"kernel-level confirm run {row['id']} with the {row['launcher'][len(REPRO_PREFIX) :]} stand-in"
            if stand_in
            else f"confirm run {row['id']}"
        )
        for key, value in after.items():
            component = _key_component(str(key))
            if component is None or not isinstance(value, str) or value.lower() in NOT_A_BACKEND:
                continue
            if not fixed and before.get(key) == value:
                continue  # it ran in the crash too: not what this run tested
            model = " (draft)" if str(key).startswith("draft_") else ""
            where = f" on {row['host_name']}" if row["host_name"] else ""
            evidence = Evidence(
                "works" if fixed else "fails",
                source,
                f"{run} ({status}){where}",
                f"{key}{model} = {value}" + ("" if fixed else f"; {row['error']}"),
                url,
                row["finished_at"],
            )
            claims.append(_Claim(component, value, {arch}, set(), evidence))
    return claims


def _probe_claims(user: User) -> list[_Claim]:
    """Probe results: a probe that ran and was correct works on its arch; one that could not run or
    computed wrong numbers fails there. One query."""
    runs = (
        probe_runs_visible_to(user)
        .filter(status=ProbeRun.Status.DONE)
        .values("id", "arch", "results", "host_id", "host_name", "confirm_id", "finished_at", "gpu_name")
    )
    claims = []
    for run in runs:
        if run["confirm_id"]:
            url = reverse("front:confirm", args=[run["confirm_id"]]) + "#probes"
        else:
            url = (
                reverse("front:hosts")
                + f"?probe={run['id']}"
                + (f"#host-{run['host_id']}" if run["host_id"] else "")
            )
        for probe in kernel_results(run["results"]):
            if not probe.get("backend"):
                continue
            verdict = probe_verdict(probe)
            arch = arch_name(str(probe.get("arch") or "")) or run["arch"]
            if not verdict or not arch:
                continue
            detail = str(probe.get("status") or "")
            if probe.get("error"):
                detail += f": {str(probe['error'])[:200]}"
            elif isinstance(probe.get("peak_fraction"), int | float):
                detail += f" at {probe['peak_fraction'] * 100:.0f}% of peak"
            evidence = Evidence(
                verdict,
                "probe",
                f"probe {probe.get('name')} on {run['host_name'] or run['gpu_name'] or 'a host'}",
                detail.strip(": "),
                url,
                run["finished_at"],
            )
            claims.append(_Claim(_probe_component(probe), str(probe["backend"]), {arch}, set(), evidence))
    return claims


def compat_matrix(user: User, *, kb: KnowledgeBase | None = None) -> CompatMatrix:
    """Backend x GPU arch: works / fails / untested, each cell with the evidence behind it."""
    kb_claims, cited = _kb_claims((kb or load_knowledge_base()).signatures)
    claims = [*kb_claims, *_confirm_claims(user), *_probe_claims(user)]
    arches = set(BASE_ARCHES)
    for claim in claims:
        arches |= claim.arches or set()
    columns = sorted(arches, key=_arch_key)
    table: dict[tuple[str, str], dict[str, Cell]] = {}
    for component, backends in DEFAULT_ROWS.items():
        for backend in backends:
            table[(component, backend)] = {arch: Cell(arch) for arch in columns}
    for claim in claims:
        cells = table.setdefault((claim.component, claim.backend), {arch: Cell(arch) for arch in columns})
        targets = claim.arches if claim.arches is not None else set(columns) - claim.except_arches
        for arch in targets:
            evidence = cells[arch].evidence
            # a signature that names the backend twice (a condition and a dead end) is one piece of evidence
            if claim.evidence.source == "kb" and any(e.url == claim.evidence.url for e in evidence):
                continue
            evidence.append(claim.evidence)

    def order(key: tuple[str, str]) -> tuple[int, str, int, str]:
        component, backend = key
        group = COMPONENT_ORDER.index(component) if component in COMPONENT_ORDER else len(COMPONENT_ORDER)
        defaults = DEFAULT_ROWS.get(component, ())
        place = defaults.index(backend) if backend in defaults else len(defaults)
        return (group, component, place, backend)

    rows = [
        Row(component, backend, [table[(component, backend)][arch] for arch in columns])
        for component, backend in sorted(table, key=order)
    ]
    return CompatMatrix(columns, rows, sorted(cited.values(), key=lambda c: c.id))

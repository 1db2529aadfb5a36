"""The JSON API of the knowledge base: the reviewed signatures (dispatchlab/core/signatures/data), each with
what GPU confirm runs showed about its fix and the caller's decision records linked to it."""

from __future__ import annotations

from pathlib import Path

from django.http import HttpRequest, HttpResponse, JsonResponse

from dispatchlab.api.auth import authenticate, error
from dispatchlab.api.pagination import page_answer
from dispatchlab.api.schema import operation
from dispatchlab.api.shapes import Error
from dispatchlab.api.signature_shapes import (
    Patterns,
    Signature,
    SignatureConfirmation,
    SignatureFix,
    SignatureListQuery,
    SignaturePage,
    SignatureSummary,
    TriedAndFailed,
)
from dispatchlab.core.signatures import DATA_DIR, load_knowledge_base
from dispatchlab.core.signatures import Signature as KbSignature
from dispatchlab.decisions.selectors import signature_decision_refs
from dispatchlab.gpu.models import ConfirmRun


def _area(signature: KbSignature) -> str:
    return Path(signature.path).parent.name


def signature_summary(signature: KbSignature) -> SignatureSummary:
    return SignatureSummary(
        id=signature.id,
        title=signature.title,
        failure_class=signature.failure_class,
        severity=signature.severity,
        level=signature.level,
        area=_area(signature),
        fix=SignatureFix(summary=signature.fix_summary, args=signature.fix_args, env=signature.fix_env),
        references=signature.references,
    )


def _matches(signature: KbSignature, query: SignatureListQuery) -> bool:
    for name, value in (
        ("failure_class", signature.failure_class),
        ("area", _area(signature)),
        ("severity", signature.severity),
        ("level", signature.level),
    ):
        if name in query and query[name] != value:  # type: ignore[literal-required]
            return False
    text = query.get("q", "").lower()
    if text:
        haystack = (signature.id, signature.title, signature.fix_summary, signature.explanation)
        return any(text in part.lower() for part in haystack)
    return True


@operation(
    "GET",
    "signatures_list",
    summary="The knowledge base: the reviewed signatures, by id, with their fixes",
    query=SignatureListQuery,
    answers={200: (SignaturePage, "A page of signatures.")},
    tags=("knowledge base",),
)
def signatures(request: HttpRequest, *, query: SignatureListQuery) -> HttpResponse:
    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    kb = load_knowledge_base()
    found = sorted((s for s in kb.signatures if _matches(s, query)), key=lambda s: s.id)
    return JsonResponse(
        SignaturePage(**page_answer(request, query, found, signature_summary), kb_digest=kb.digest)
    )


@operation(
    "GET",
    "signatures_read",
    summary="A signature in full: explanation, what was tried and failed, patterns, GPU confirmations",
    answers={200: (Signature, "The signature."), 404: (Error, "No such signature in the knowledge base.")},
    tags=("knowledge base",),
)
def signature(request: HttpRequest, signature_id: str) -> HttpResponse:
    from dispatchlab.gpu.confirm_outcomes import signature_confirmations

    caller = authenticate(request)
    if isinstance(caller, JsonResponse):
        return caller
    kb = load_knowledge_base()
    found = next((s for s in kb.signatures if s.id == signature_id), None)
    if found is None:
        return error("no such signature", 404)
    confirmations = signature_confirmations([found.id]).get(found.id, [])
    # A signature's confirmations come from every project; only the caller's own runs are named.
    visible = set(
        ConfirmRun.objects.filter(
            id__in=[c.confirm_id for c in confirmations], project__in=caller.projects()
        ).values_list("id", flat=True)
    )
    return JsonResponse(
        Signature(
            **signature_summary(found),
            explanation=found.explanation,
            tried_and_failed=[TriedAndFailed(what=t.what, why=t.why) for t in found.tried_and_failed],
            fix_by_server={
                server: SignatureFix(summary=variant.summary, args=variant.args, env=variant.env)
                for server, variant in found.fix_by_server.items()
            },
            match=Patterns(
                any=found.any_patterns, all=found.all_patterns, sequence=found.sequence, within=found.within
            ),
            conditions=found.conditions,
            supersedes=found.supersedes,
            source=Path(found.path).relative_to(DATA_DIR).as_posix(),
            kb_digest=kb.digest,
            confirmations=[
                SignatureConfirmation(
                    outcome=item.outcome,
                    label=item.label(),
                    gpu_name=item.gpu_name,
                    arch=item.arch,
                    server=item.server,
                    server_version=item.server_version,
                    evidence=item.evidence,  # type: ignore[typeddict-item]
                    launcher=item.launcher_label,
                    weights=item.weights,
                    created_at=item.created_at.isoformat(),
                    confirm=item.confirm_id if item.confirm_id in visible else None,
                )
                for item in confirmations
            ],
            decisions=signature_decision_refs(found.id, caller.projects()),  # type: ignore[typeddict-item]
        )
    )

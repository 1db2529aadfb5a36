from __future__ import annotations

from django.urls import path

from dispatchlab.api import decision_views, docs, gpu_views, group_views, signature_views, sweep_views, views
from dispatchlab.api.errors import json_not_allowed

app_name = "api"

urlpatterns = [
    path("", json_not_allowed(docs.api_docs), name="docs"),
    path("schema/", views.schema, name="schema"),
    path("v1/reports", views.reports, name="reports"),
    path("v1/reports/<int:report_id>", views.report_detail, name="report"),
    path("v1/hooks/ci", views.ci_hook, name="ci_hook"),
    path("v1/reports/<int:report_id>/redact", views.report_redact, name="report_redact"),
    path("v1/reports/<int:report_id>/confirm", gpu_views.report_confirm, name="report_confirm"),
    path("v1/confirms/<int:confirm_id>", gpu_views.confirm_detail, name="confirm"),
    path("v1/confirms/<int:confirm_id>/cancel", gpu_views.confirm_cancel_view, name="confirm_cancel"),
    path("v1/hosts", gpu_views.hosts, name="hosts"),
    path("v1/reports/<int:report_id>/sweep", sweep_views.report_sweep, name="report_sweep"),
    path("v1/sweeps/<int:sweep_id>", sweep_views.sweep_detail, name="sweep"),
    path("v1/decisions", decision_views.decisions, name="decisions"),
    path("v1/decisions/<int:decision_id>", decision_views.decision_detail, name="decision"),
    path("v1/decisions/<int:decision_id>/history", decision_views.decision_history, name="decision_history"),
    path("v1/groups", group_views.groups, name="groups"),
    path("v1/groups/<int:group_id>", group_views.group, name="group"),
    path("v1/signatures", signature_views.signatures, name="signatures"),
    path("v1/signatures/<slug:signature_id>", signature_views.signature, name="signature"),
]

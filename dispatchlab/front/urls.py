from __future__ import annotations

from django.urls import path

from dispatchlab.front import decision_views, gpu_views, notify_views, redact_views, sweep_views, views

app_name = "front"

urlpatterns = [
    path("", views.report_list, name="report_list"),
    path("upload/", views.upload, name="upload"),
    path("reports/<int:report_id>/", views.report, name="report"),
    path("reports/<int:report_id>/status/", views.report_status, name="report_status"),
    path("reports/<int:report_id>/log/", views.log, name="log"),
    path("reports/<int:report_id>/redact/", redact_views.redact, name="redact"),
    path("groups/", views.groups, name="groups"),
    path("groups/<int:group_id>/", views.group, name="group"),
    path("compare/", views.compare, name="compare"),
    # the GPU side
    path("hosts/", gpu_views.hosts, name="hosts"),
    path("hosts/<int:host_id>/probe/", gpu_views.host_probe, name="host_probe"),
    path("reports/<int:report_id>/confirm/", gpu_views.confirm_new, name="confirm_new"),
    path("confirms/<int:confirm_id>/", gpu_views.confirm, name="confirm"),
    path("confirms/<int:confirm_id>/status/", gpu_views.confirm_status, name="confirm_status"),
    path("confirms/<int:confirm_id>/cancel/", gpu_views.confirm_cancel, name="confirm_cancel"),
    path("compat/", gpu_views.compat, name="compat"),
    # the backend sweep
    path("reports/<int:report_id>/sweep/", sweep_views.sweep_new, name="sweep_new"),
    path("sweeps/<int:sweep_id>/", sweep_views.sweep, name="sweep"),
    path("sweeps/<int:sweep_id>/status/", sweep_views.sweep_status, name="sweep_status"),
    path("sweeps/<int:sweep_id>/confirm/", sweep_views.sweep_confirm, name="sweep_confirm"),
    # decision records
    path("decisions/", decision_views.decision_list, name="decisions"),
    path("decisions/new/", decision_views.decision_new, name="decision_new"),
    path("decisions/<int:decision_id>/", decision_views.decision_detail, name="decision"),
    path("decisions/<int:decision_id>/edit/", decision_views.decision_edit, name="decision_edit"),
    # notifications out (webhooks of a project)
    path("notifications/", notify_views.index, name="notifications"),
    path("notifications/<slug:project_slug>/", notify_views.project_endpoints, name="notify_project"),
    path(
        "notifications/<slug:project_slug>/<int:endpoint_id>/",
        notify_views.endpoint_detail,
        name="notify_endpoint",
    ),
    path(
        "notifications/<slug:project_slug>/<int:endpoint_id>/test/",
        notify_views.endpoint_test,
        name="notify_test",
    ),
    path(
        "notifications/<slug:project_slug>/<int:endpoint_id>/pause/",
        notify_views.endpoint_pause,
        name="notify_pause",
    ),
    path(
        "notifications/<slug:project_slug>/<int:endpoint_id>/resume/",
        notify_views.endpoint_resume,
        name="notify_resume",
    ),
    path(
        "notifications/<slug:project_slug>/<int:endpoint_id>/delete/",
        notify_views.endpoint_delete,
        name="notify_delete",
    ),
]

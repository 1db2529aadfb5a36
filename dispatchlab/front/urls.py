from __future__ import annotations

from django.urls import path

from dispatchlab.front import gpu_views, views

app_name = "front"

urlpatterns = [
    path("", views.report_list, name="report_list"),
    path("upload/", views.upload, name="upload"),
    path("reports/<int:report_id>/", views.report, name="report"),
    path("reports/<int:report_id>/status/", views.report_status, name="report_status"),
    path("reports/<int:report_id>/log/", views.log, name="log"),
    path("groups/", views.groups, name="groups"),
    path("groups/<int:group_id>/", views.group, name="group"),
    path("compare/", views.compare, name="compare"),
    # the GPU side
    path("hosts/", gpu_views.hosts, name="hosts"),
    path("hosts/<int:host_id>/probe/", gpu_views.host_probe, name="host_probe"),
    path("reports/<int:report_id>/confirm/", gpu_views.confirm_new, name="confirm_new"),
    path("confirms/<int:confirm_id>/", gpu_views.confirm, name="confirm"),
    path("confirms/<int:confirm_id>/status/", gpu_views.confirm_status, name="confirm_status"),
    path("compat/", gpu_views.compat, name="compat"),
]

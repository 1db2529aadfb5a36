from __future__ import annotations

from django.urls import path

from dispatchlab.front import views

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
]

from __future__ import annotations

from django.urls import path

from dispatchlab.api import views

app_name = "api"

urlpatterns = [
    path("schema/", views.schema, name="schema"),
    path("v1/reports", views.reports, name="reports"),
    path("v1/reports/<int:report_id>", views.report_detail, name="report"),
    path("v1/hooks/ci", views.ci_hook, name="ci_hook"),
]

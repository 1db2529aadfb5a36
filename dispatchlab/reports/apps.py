from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "dispatchlab.reports"
    label = "reports"
    verbose_name = "Reports"

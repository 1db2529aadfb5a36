from django.apps import AppConfig


class GpuConfig(AppConfig):
    name = "dispatchlab.gpu"
    label = "gpu"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dispatchlab import events
        from dispatchlab.gpu import handlers
        from dispatchlab.reports.copies import register_quoted_copies

        events.subscribe(events.ReportParsed, handlers.report_parsed)
        register_quoted_copies("gpu", handlers.ConfirmTexts())

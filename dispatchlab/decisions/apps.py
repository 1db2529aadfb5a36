from django.apps import AppConfig


class DecisionsConfig(AppConfig):
    name = "dispatchlab.decisions"
    label = "decisions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dispatchlab import events
        from dispatchlab.decisions import handlers

        events.subscribe(events.ReportParsed, handlers.report_parsed)

from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "dispatchlab.notify"
    label = "notify"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from dispatchlab import events
        from dispatchlab.notify import handlers
        from dispatchlab.reports.copies import register_quoted_copies

        events.subscribe(events.FailureGroupOpened, handlers.failure_group_opened)
        events.subscribe(events.FailureGroupRecurred, handlers.failure_group_recurred)
        events.subscribe(events.DecisionTurnedStale, handlers.decision_turned_stale)
        register_quoted_copies("notify", handlers.EventPayloads())

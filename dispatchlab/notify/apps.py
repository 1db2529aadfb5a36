from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "dispatchlab.notify"
    label = "notify"
    default_auto_field = "django.db.models.BigAutoField"

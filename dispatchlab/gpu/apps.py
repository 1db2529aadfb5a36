from django.apps import AppConfig


class GpuConfig(AppConfig):
    name = "dispatchlab.gpu"
    label = "gpu"
    default_auto_field = "django.db.models.BigAutoField"

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "dispatchlab.api"
    label = "api"
    verbose_name = "API"

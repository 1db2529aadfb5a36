from django.apps import AppConfig


class FrontConfig(AppConfig):
    name = "dispatchlab.front"
    label = "front"
    verbose_name = "Pages"

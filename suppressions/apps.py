from django.apps import AppConfig


class SuppressionsConfig(AppConfig):
    name = "suppressions"
    verbose_name = "Suppression list"
